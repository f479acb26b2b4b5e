"""Two SparseCore subcores scatter-write one HBM row without add: subcores 0 and 1 each
scatter their L rows into out (HBM) through an index vector, and both index vectors name
row 5. A plain scatter is a store: which subcore's row lands is up to the DMA engines
(sc_hbm_scatter_race_ok.py keeps the index sets disjoint; Mosaic takes no scatter-add into
HBM, but atomic adds into one VMEM_SHARED row do not race: sc_scatter_add_one_row_ok.py).

Run: pallas-check run samples/sc_hbm_scatter_race_bug.py --tpu v6e --races
Expected finding: kind=race buffer=o_hbm range=[5, 0:128] line=35 args=--tpu v6e --races
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
        # BUG: both subcores' index vectors name row 5, and a plain scatter stores.
        pltpu.async_copy(rows_v, o_hbm.at[idx_v], sem).wait()

    return kernel(x, idx)


if __name__ == "__main__":
    lanes = pltpu.get_tpu_info().sparse_core.num_lanes
    rows = NSUB * lanes
    x = jnp.arange(rows * D, dtype=jnp.float32).reshape(rows, D)
    idx = np.arange(rows, dtype=np.int32)[::-1].copy()
    idx[0] = idx[lanes] = 5  # subcore 0's first row and subcore 1's first row
    out = jax.jit(scatter)(x, jnp.asarray(idx))
    print("sc_hbm_scatter_race_bug: out[5, :2] =", np.asarray(out)[5, :2])
