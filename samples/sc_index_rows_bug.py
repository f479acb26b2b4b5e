"""A SparseCore gather in steps, each step's indices one row of a 2-D index table in VMEM,
with one index past the table.

As sc_index_rows_ok.py (32 vector subcores of two SparseCores, `t_hbm.at[idx_v.at[i]]`
per step), but the caller builds the indices modulo ROWS + 1: index 64 of the 64-row
table selects a row past its end.

Run: pallas-check run samples/sc_index_rows_bug.py --tpu v6e
Expected finding: kind=out-of-bounds buffer=t_hbm range=[64, 0:128] line=35 args=--tpu v6e
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
    idx = (np.arange(NC * NSUB * STEPS * L, dtype=np.int32) * 7) % (ROWS + 1)  # BUG
    out = jax.jit(gather)(table, jnp.asarray(idx.reshape(NC * NSUB, STEPS, L)))
    print("sc_index_rows_bug: out[0, :2] =", np.asarray(out)[0, :2])
