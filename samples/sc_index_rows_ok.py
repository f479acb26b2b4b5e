"""A SparseCore gather in steps, each step's indices one row of a 2-D index table in VMEM.

Each of the 32 vector subcores of two SparseCores copies its (STEPS, L) rows of indices
into VMEM once, then gathers L rows of the table per step with `t_hbm.at[idx_v.at[i]]`:
row i of the index table is a 1-D index vector, which Mosaic takes (libtpu 0.0.42
compiles this kernel for v6e and v7x); pallas-check once refused it as a 2-D index
vector (a false compile-error, its outputs lost).

Run: pallas-check run samples/sc_index_rows_ok.py --tpu v6e
Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

NC, NSUB, STEPS, ROWS, D = 2, 16, 2, 64, 128


def gather(table, idx):
    L = pltpu.get_tpu_info().sparse_core.num_lanes  # 8 on v6e, 16 on v7x
    W = NC * NSUB
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=NC, num_subcores=NSUB)

    @pl.kernel(out_type=jax.ShapeDtypeStruct((W * STEPS * L, D), table.dtype), mesh=mesh,
               scratch_types=[pltpu.VMEM((STEPS, L), jnp.int32),
                              pltpu.VMEM((L, D), jnp.float32)])
    def kernel(t_hbm, idx_hbm, o_hbm, idx_v, rows_v):
        w = jax.lax.axis_index("core") * NSUB + jax.lax.axis_index("subcore")
        pltpu.sync_copy(idx_hbm.at[w], idx_v)
        for i in range(STEPS):
            pltpu.sync_copy(t_hbm.at[idx_v.at[i]], rows_v)
            pltpu.sync_copy(rows_v, o_hbm.at[pl.ds((w * STEPS + i) * L, L)])

    return kernel(table, idx)


if __name__ == "__main__":
    L = pltpu.get_tpu_info().sparse_core.num_lanes
    table = jnp.arange(ROWS * D, dtype=jnp.float32).reshape(ROWS, D)
    idx = (np.arange(NC * NSUB * STEPS * L, dtype=np.int32) * 7) % ROWS
    out = jax.jit(gather)(table, jnp.asarray(idx.reshape(NC * NSUB, STEPS, L)))
    np.testing.assert_array_equal(np.asarray(out), np.asarray(table)[idx])
    print("sc_index_rows_ok: output matches")
