"""A SparseCore gather with an index past the end: each of 4 vector subcores gathers L
rows of x (16 rows) by its slice of an index vector, but element 3 of subcore 0's index
vector is 16, one row past x: on a TPU the DMA reads memory that is not x's.

Run: pallas-check run samples/sc_gather_oob_bug.py --tpu v6e
Expected finding: kind=out-of-bounds buffer=x_hbm range=[16, 0:128] line=31 args=--tpu v6e
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

ROWS, NSUB, D = 16, 4, 128


def gather(x, idx):
    lanes = pltpu.get_tpu_info().sparse_core.num_lanes
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=1, num_subcores=NSUB)

    @pl.kernel(out_type=jax.ShapeDtypeStruct((NSUB * lanes, D), jnp.float32), mesh=mesh,
               scratch_types=[pltpu.VMEM((lanes,), jnp.int32),
                              pltpu.VMEM((lanes, D), jnp.float32), pltpu.SemaphoreType.DMA])
    def kernel(x_hbm, idx_hbm, o_hbm, idx_v, rows_v, sem):
        s = jax.lax.axis_index("subcore")
        pltpu.sync_copy(idx_hbm.at[pl.ds(s * lanes, lanes)], idx_v)
        # BUG: subcore 0's index vector holds 16 (element 3): x has rows 0..15.
        pltpu.async_copy(x_hbm.at[idx_v], rows_v, sem).wait()
        pltpu.sync_copy(rows_v, o_hbm.at[pl.ds(s * lanes, lanes)])

    return kernel(x, idx)


if __name__ == "__main__":
    n = NSUB * pltpu.get_tpu_info().sparse_core.num_lanes
    x = jnp.arange(ROWS * D, dtype=jnp.float32).reshape(ROWS, D)
    idx = (np.arange(n, dtype=np.int32) * 3) % ROWS
    idx[3] = ROWS
    out = jax.jit(gather)(x, jnp.asarray(idx))
    ok = np.array_equal(np.asarray(out)[4:], np.asarray(x)[idx[4:]])
    print("sc_gather_oob_bug: in-bounds rows match reference:", ok)
