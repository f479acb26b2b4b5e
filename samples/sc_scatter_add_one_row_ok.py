"""Two SparseCore subcores scatter-ADD into one row of a VMEM_SHARED table: each subcore
first zeroes its own L rows of the table, a `plsc.subcore_barrier()` orders those stores
before every add, then each adds its L rows into the table through an index vector, and both
index vectors name row 5. `add=True` makes each element an atomic read-modify-write: the two
adds to row 5 do not race, and row 5 holds both rows' sum. A second barrier orders every add
before each subcore copies its own L rows of the table out to HBM.

The table is in VMEM_SHARED, not HBM: Mosaic SparseCore (libtpu 0.0.42) accepts `add=True`
from VMEM into VMEM_SHARED only ("IndirectStreamAddStartOp doesn't support transfer from
source memory space TileSpmem to destination memory space HBM"). A plain scatter into HBM
builds: sc_hbm_scatter_race_bug.py.

Run: pallas-check run samples/sc_scatter_add_one_row_ok.py --tpu v6e --races
"""
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

NSUB, D = 2, 128


def scatter_add(x, idx):
    lanes = pltpu.get_tpu_info().sparse_core.num_lanes
    rows = NSUB * lanes
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=1, num_subcores=NSUB)

    @pl.kernel(out_type=jax.ShapeDtypeStruct((rows, D), jnp.float32), mesh=mesh,
               scratch_types=[pltpu.VMEM((lanes,), jnp.int32),
                              pltpu.VMEM((lanes, D), jnp.float32),
                              pltpu.VMEM_SHARED((rows, D), jnp.float32),
                              pltpu.SemaphoreType.DMA])
    def kernel(x_hbm, idx_hbm, o_hbm, idx_v, rows_v, table_sh, sem):
        s = jax.lax.axis_index("subcore")
        mine = pl.ds(s * lanes, lanes)
        rows_v[...] = jnp.zeros((lanes, D), jnp.float32)
        pltpu.sync_copy(rows_v, table_sh.at[mine])
        plsc.subcore_barrier()  # every row of the table is zero before any subcore adds
        pltpu.sync_copy(idx_hbm.at[mine], idx_v)
        pltpu.sync_copy(x_hbm.at[mine], rows_v)
        # Both subcores add into row 5: atomic adds, no race.
        pltpu.async_copy(rows_v, table_sh.at[idx_v], sem, add=True).wait()
        plsc.subcore_barrier()  # every add has landed before any subcore reads the table
        pltpu.sync_copy(table_sh.at[mine], o_hbm.at[mine])

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
    print("sc_scatter_add_one_row_ok: output matches")
