"""A filtered gather on a SparseCore: each of the 16 vector subcores gathers L rows of x
(HBM) through an index vector in its VMEM, index -1 skipped (`plsc.Indices(idx,
ignored_value=-1)`), so those destination rows keep the zeros written first.

Run: pallas-check run samples/sc_filtered_gather_ok.py --tpu v6e
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

ROWS, D, NSUB = 64, 128, 16


def gather(x, idx):
    lanes = pltpu.get_tpu_info().sparse_core.num_lanes
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=1)

    @pl.kernel(out_type=jax.ShapeDtypeStruct((NSUB * lanes, D), x.dtype), mesh=mesh,
               scratch_types=[pltpu.VMEM((lanes,), jnp.int32),
                              pltpu.VMEM((lanes, D), x.dtype), pltpu.SemaphoreType.DMA])
    def kernel(x_hbm, idx_hbm, o_hbm, idx_v, rows_v, sem):
        s = jax.lax.axis_index("subcore")
        pltpu.sync_copy(idx_hbm.at[pl.ds(s * lanes, lanes)], idx_v)
        rows_v[...] = jnp.zeros((lanes, D), x.dtype)
        pltpu.async_copy(x_hbm.at[plsc.Indices(idx_v, ignored_value=-1)], rows_v,
                         sem).wait()
        pltpu.sync_copy(rows_v, o_hbm.at[pl.ds(s * lanes, lanes)])

    return kernel(x, idx)


if __name__ == "__main__":
    n = NSUB * pltpu.get_tpu_info().sparse_core.num_lanes
    x = jnp.arange(ROWS * D, dtype=jnp.float32).reshape(ROWS, D)
    idx = (np.arange(n, dtype=np.int32) * 7) % ROWS
    idx[np.arange(n) % 5 == 0] = -1
    out = jax.jit(gather)(x, jnp.asarray(idx))
    want = np.zeros((n, D), np.float32)
    keep = idx != -1
    want[keep] = np.asarray(x)[idx[keep]]
    np.testing.assert_array_equal(np.asarray(out), want)
    print("sc_filtered_gather_ok: output matches")
