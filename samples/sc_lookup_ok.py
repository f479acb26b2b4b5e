"""SparseCore table lookup: each of 4 vector subcores looks up its lane-wide chunk of ids
in a small table held in its VMEM with `plsc.load_gather`; padding ids are -1, so the
gather is masked to the valid lanes, and `plsc.cumsum` with the same mask gives the running
sum of the looked-up values (padding adds nothing). Expected findings: none.

Run: pallas-check run samples/sc_lookup_ok.py --tpu v6e
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

SUBCORES = 4
TABLE = 40


def lookup(table, ids):
    lanes = pltpu.get_tpu_info().sparse_core.num_lanes  # 8 on v6e, 16 on v7x
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=1, num_subcores=SUBCORES)
    out = jax.ShapeDtypeStruct(ids.shape, jnp.float32)

    @pl.kernel(out_type=(out, out), mesh=mesh,
               compiler_params=pltpu.CompilerParams(needs_layout_passes=False),
               scratch_types=[pltpu.VMEM((TABLE,), jnp.float32),
                              pltpu.VMEM((lanes,), jnp.int32),
                              pltpu.VMEM((lanes,), jnp.float32),
                              pltpu.VMEM((lanes,), jnp.float32)])
    def kernel(table_hbm, ids_hbm, vals_hbm, sums_hbm, table_v, ids_v, vals_v, sums_v):
        chunk = pl.ds(jax.lax.axis_index("subcore") * lanes, lanes)
        pltpu.sync_copy(table_hbm, table_v)
        pltpu.sync_copy(ids_hbm.at[chunk], ids_v)
        ids = ids_v[...]
        valid = ids >= 0  # -1 pads the chunk
        vals = plsc.load_gather(table_v, [ids], mask=valid)
        vals_v[...] = jnp.where(valid, vals, 0.0)
        sums_v[...] = plsc.cumsum(vals, mask=valid)
        pltpu.sync_copy(vals_v, vals_hbm.at[chunk])
        pltpu.sync_copy(sums_v, sums_hbm.at[chunk])

    return kernel(table, ids)


def reference(table, ids, lanes):
    vals = np.where(ids >= 0, table[np.maximum(ids, 0)], 0.0).astype(np.float32)
    return vals, np.cumsum(vals.reshape(-1, lanes), axis=1).ravel()


def make_ids(n):
    ids = ((np.arange(n) * 7) % TABLE).astype(np.int32)
    ids[3::5] = -1  # padding
    return ids


if __name__ == "__main__":
    lanes = pltpu.get_tpu_info().sparse_core.num_lanes
    table = (np.arange(TABLE) * 0.5 - 3).astype(np.float32)
    ids = make_ids(SUBCORES * lanes)
    got = jax.jit(lookup)(jnp.asarray(table), jnp.asarray(ids))
    for g, w in zip(got, reference(table, ids, lanes)):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-6)
    print("sc_lookup_ok: output matches")
