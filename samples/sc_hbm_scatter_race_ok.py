"""Two SparseCore subcores scatter rows into one HBM array, each row exactly once:
subcores 0 and 1 each scatter their L rows into out (HBM) through an index vector, and
the two index vectors together are a permutation of the rows (the index sets are
disjoint), so no row is written twice.

Run: pallas-check run samples/sc_hbm_scatter_race_ok.py --tpu v6e --races
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

NSUB, D = 2, 128  # indirect-DMA rows in HBM must be 128-lane aligned (Mosaic SC)


def scatter(x, idx):
    lanes = pltpu.get_tpu_info().sparse_core.num_lanes
    rows = NSUB * lanes
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=1, num_subcores=NSUB)

    @pl.kernel(out_type=jax.ShapeDtypeStruct((rows, D), jnp.float32), mesh=mesh,
               scratch_types=[pltpu.VMEM((lanes,), jnp.int32),
                              pltpu.VMEM((lanes, D), jnp.float32), pltpu.SemaphoreType.DMA])
    def kernel(x_hbm, idx_hbm, o_hbm, idx_v, rows_v, sem):
        s = jax.lax.axis_index("subcore")
        pltpu.sync_copy(idx_hbm.at[pl.ds(s * lanes, lanes)], idx_v)
        pltpu.sync_copy(x_hbm.at[pl.ds(s * lanes, lanes)], rows_v)
        # Disjoint index sets: each row of out is stored by one subcore only.
        pltpu.async_copy(rows_v, o_hbm.at[idx_v], sem).wait()

    return kernel(x, idx)


if __name__ == "__main__":
    lanes = pltpu.get_tpu_info().sparse_core.num_lanes
    rows = NSUB * lanes
    x = jnp.arange(rows * D, dtype=jnp.float32).reshape(rows, D)
    idx = np.arange(rows, dtype=np.int32)[::-1].copy()
    out = jax.jit(scatter)(x, jnp.asarray(idx))
    want = np.zeros((rows, D), np.float32)
    want[idx] = np.asarray(x)
    np.testing.assert_array_equal(np.asarray(out), want)
    print("sc_hbm_scatter_race_ok: output matches")
