"""An MoE permute / unpermute pair on a SparseCore, two kernels in one jit: permute
scatters each token's row to its slot in expert order (`o_hbm.at[dest_v]`, a scatter
DMA), unpermute gathers them back (`y_hbm.at[dest_v]`, a gather DMA); each of 4 vector
subcores moves L tokens. unpermute(permute(x)) == x.

Run: pallas-check run samples/sc_moe_permute_ok.py --tpu v6e
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

NSUB, EXPERTS, D = 4, 3, 128  # HBM rows 128-lane aligned (Mosaic SC)


def permute_both(x, dest):
    lanes = pltpu.get_tpu_info().sparse_core.num_lanes
    tokens = x.shape[0]
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=1, num_subcores=NSUB)
    scratch = [pltpu.VMEM((lanes,), jnp.int32), pltpu.VMEM((lanes, D), jnp.float32),
               pltpu.SemaphoreType.DMA]

    @pl.kernel(out_type=jax.ShapeDtypeStruct((tokens, D), jnp.float32), mesh=mesh,
               scratch_types=scratch)
    def permute(x_hbm, dest_hbm, o_hbm, dest_v, rows_v, sem):
        s = jax.lax.axis_index("subcore")
        pltpu.sync_copy(dest_hbm.at[pl.ds(s * lanes, lanes)], dest_v)
        pltpu.sync_copy(x_hbm.at[pl.ds(s * lanes, lanes)], rows_v)
        pltpu.async_copy(rows_v, o_hbm.at[dest_v], sem).wait()

    @pl.kernel(out_type=jax.ShapeDtypeStruct((tokens, D), jnp.float32), mesh=mesh,
               scratch_types=scratch)
    def unpermute(y_hbm, dest_hbm, o_hbm, dest_v, rows_v, sem):
        s = jax.lax.axis_index("subcore")
        pltpu.sync_copy(dest_hbm.at[pl.ds(s * lanes, lanes)], dest_v)
        pltpu.async_copy(y_hbm.at[dest_v], rows_v, sem).wait()
        pltpu.sync_copy(rows_v, o_hbm.at[pl.ds(s * lanes, lanes)])

    y = permute(x, dest)
    return y, unpermute(y, dest)


if __name__ == "__main__":
    tokens = NSUB * pltpu.get_tpu_info().sparse_core.num_lanes
    x = np.arange(tokens * D, dtype=np.float32).reshape(tokens, D)
    expert = (np.arange(tokens) * 7) % EXPERTS
    dest = np.empty(tokens, np.int32)
    dest[np.argsort(expert, kind="stable")] = np.arange(tokens, dtype=np.int32)
    y, back = jax.jit(permute_both)(jnp.asarray(x), jnp.asarray(dest))
    want = np.empty_like(x)
    want[dest] = x
    np.testing.assert_array_equal(np.asarray(y), want)
    np.testing.assert_array_equal(np.asarray(back), x)
    print("sc_moe_permute_ok: output matches")
