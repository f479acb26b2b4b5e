"""SparseCore sort: each of 4 vector subcores sorts its lane-wide chunk of (key, position)
pairs with `plsc.sort_key_val` -- ascending, keys with ties and negatives (a stable sort
keeps tied keys in lane order) -- and also sorts them descending with the odd keys masked
off (masked-off pairs go last, in lane order). Expected findings: none.

Run: pallas-check run samples/sc_sort_ok.py --tpu v6e
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

SUBCORES = 4


def sort_chunks(keys):
    lanes = pltpu.get_tpu_info().sparse_core.num_lanes  # 8 on v6e, 16 on v7x
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=1, num_subcores=SUBCORES)
    n = keys.shape[0]
    out = jax.ShapeDtypeStruct((n,), jnp.int32)

    @pl.kernel(out_type=(out, out, out, out), mesh=mesh,
               compiler_params=pltpu.CompilerParams(needs_layout_passes=False),
               scratch_types=[pltpu.VMEM((lanes,), jnp.int32)] * 5)
    def kernel(k_hbm, ko_hbm, vo_hbm, kd_hbm, vd_hbm, k_v, ko_v, vo_v, kd_v, vd_v):
        chunk = pl.ds(jax.lax.axis_index("subcore") * lanes, lanes)
        pltpu.sync_copy(k_hbm.at[chunk], k_v)
        keys = k_v[...]
        positions = jax.lax.iota(jnp.int32, lanes)
        ko_v[...], vo_v[...] = plsc.sort_key_val(keys, positions)
        even = keys % 2 == 0
        kd_v[...], vd_v[...], _ = plsc.sort_key_val(keys, positions, mask=even,
                                                    descending=True)
        for src, dst in ((ko_v, ko_hbm), (vo_v, vo_hbm), (kd_v, kd_hbm), (vd_v, vd_hbm)):
            pltpu.sync_copy(src, dst.at[chunk])

    return kernel(keys)


def reference(keys, lanes):
    chunks = keys.reshape(-1, lanes)
    up = np.argsort(chunks, axis=1, kind="stable")
    # descending, stable, masked-off (odd) keys last in lane order: sort by (odd, -key)
    down = np.stack([np.lexsort((np.where(row % 2, 0, -row.astype(np.int64)), row % 2))
                     for row in chunks])
    take = lambda order: (np.take_along_axis(chunks, order, 1).ravel(),
                          order.astype(np.int32).ravel())
    return (*take(up), *take(down))


if __name__ == "__main__":
    lanes = pltpu.get_tpu_info().sparse_core.num_lanes
    n = SUBCORES * lanes
    keys = ((np.arange(n) * 37) % 11 - 5).astype(np.int32)  # ties and negatives
    got = jax.jit(sort_chunks)(jnp.asarray(keys))
    for g, w in zip(got, reference(keys, lanes)):
        np.testing.assert_array_equal(np.asarray(g), w)
    print("sc_sort_ok: output matches")
