"""A gather pipelined with `pltpu.emit_pipeline` over `pl.Indirect` blocks on two
SparseCores.

Each of 32 vector subcores copies its (STEPS, L) index table into VMEM; the pipeline's
input block is `pl.BlockSpec((pl.Indirect(L), D), lambda i: (idx_v.at[i], 0))`: step i
gathers the L table rows that row i of the index table names, and the body copies them
to the output block. libtpu 0.0.42 compiles it for v6e and v7x; pallas-check once
reported it as a compile-error (a 2-D index vector), losing its outputs.

Run: pallas-check run samples/sc_indirect_pipeline_ok.py --tpu v6e
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
               scratch_types=[pltpu.VMEM((STEPS, L), jnp.int32)])
    def kernel(t_hbm, idx_hbm, o_hbm, idx_v):
        w = jax.lax.axis_index("core") * NSUB + jax.lax.axis_index("subcore")
        pltpu.sync_copy(idx_hbm.at[w], idx_v)

        def body(rows_v, o_v):
            o_v[...] = rows_v[...]

        pltpu.emit_pipeline(
            body, grid=(STEPS,),
            in_specs=[pl.BlockSpec((pl.Indirect(L), D), lambda i: (idx_v.at[i], 0))],
            out_specs=[pl.BlockSpec((L, D), lambda i: (w * STEPS + i, 0))])(t_hbm, o_hbm)

    return kernel(table, idx)


if __name__ == "__main__":
    L = pltpu.get_tpu_info().sparse_core.num_lanes
    table = jnp.arange(ROWS * D, dtype=jnp.float32).reshape(ROWS, D)
    idx = (jnp.arange(NC * NSUB * STEPS * L, dtype=jnp.int32) * 7) % ROWS
    out = jax.jit(gather)(table, idx.reshape(NC * NSUB, STEPS, L))
    np.testing.assert_array_equal(np.asarray(out), np.asarray(table)[np.asarray(idx)])
    print("sc_indirect_pipeline_ok: output matches")
