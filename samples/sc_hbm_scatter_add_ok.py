"""Two SparseCore subcores scatter-ADD into one HBM row: each subcore first zeroes its own
L rows of out (HBM), a `plsc.subcore_barrier()` orders those stores before every add, then
each adds its L rows into out through an index vector, and both index vectors name row 5.
`add=True` makes each element an atomic read-modify-write: the two adds to row 5 do not
race (a plain scatter would: sc_hbm_scatter_race_bug.py), and row 5 holds both rows' sum.

Run: pallas-check run samples/sc_hbm_scatter_add_ok.py --tpu v6e --races
"""
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

NSUB, D = 2, 128  # indirect-DMA rows in HBM must be 128-lane aligned (Mosaic SC)


def scatter_add(x, idx):
    lanes = pltpu.get_tpu_info().sparse_core.num_lanes
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=1, num_subcores=NSUB)

    @pl.kernel(out_type=jax.ShapeDtypeStruct((NSUB * lanes, D), jnp.float32), mesh=mesh,
               scratch_types=[pltpu.VMEM((lanes,), jnp.int32),
                              pltpu.VMEM((lanes, D), jnp.float32), pltpu.SemaphoreType.DMA])
    def kernel(x_hbm, idx_hbm, o_hbm, idx_v, rows_v, sem):
        s = jax.lax.axis_index("subcore")
        rows_v[...] = jnp.zeros((lanes, D), jnp.float32)
        pltpu.sync_copy(rows_v, o_hbm.at[pl.ds(s * lanes, lanes)])
        plsc.subcore_barrier()  # every row of out is zero before any subcore adds
        pltpu.sync_copy(idx_hbm.at[pl.ds(s * lanes, lanes)], idx_v)
        pltpu.sync_copy(x_hbm.at[pl.ds(s * lanes, lanes)], rows_v)
        # Both subcores add into row 5: atomic adds, no race.
        pltpu.async_copy(rows_v, o_hbm.at[idx_v], sem, add=True).wait()

    return kernel(x, idx)


if __name__ == "__main__":
    lanes = pltpu.get_tpu_info().sparse_core.num_lanes
    rows = NSUB * lanes
    x = jnp.arange(rows * D, dtype=jnp.float32).reshape(rows, D)
    idx = np.arange(rows, dtype=np.int32)[::-1].copy()
    idx[0] = idx[lanes] = 5  # subcore 0's first row and subcore 1's first row
    out = jax.jit(scatter_add)(x, jnp.asarray(idx))
    want = np.zeros((rows, D), np.float32)
    np.add.at(want, idx, np.asarray(x))
    np.testing.assert_array_equal(np.asarray(out), want)
    print("sc_hbm_scatter_add_ok: output matches")
