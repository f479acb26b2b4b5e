"""A SparseCore lookup that gathers rows of 256 floats out of VMEM_SHARED.

The subcore stages a (64, 256) f32 table in VMEM_SHARED and gathers the rows its index
vector names into VMEM in one indirect DMA. libtpu (0.0.42, v6e and v7x) moves at most 128
32-bit elements a row between VMEM_SHARED and VMEM ("IndirectVectorStreamStartOp doesn't
support transfer from source memory space Spmem to destination memory space TileSpmem");
a column window of the wide rows is refused too. The kernel never runs on a TPU, so the
call is skipped and its output left never written. sc_shared_rows_ok.py keeps the table
there as blocks of 128 columns.

Run: pallas-check run samples/sc_shared_rows_bug.py --tpu v6e
Expected finding: kind=compile-error buffer=table_sh line=38 args=--tpu v6e
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

ROWS, D = 64, 256


def lookup(table, ids):
    lanes = ids.shape[0]
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=1, num_subcores=1)

    @pl.kernel(out_type=jax.ShapeDtypeStruct((lanes, D), table.dtype), mesh=mesh,
               scratch_types=[pltpu.VMEM((lanes,), jnp.int32),
                              pltpu.VMEM((lanes, D), table.dtype),
                              pltpu.VMEM_SHARED((ROWS, D), table.dtype)])
    def kernel(table_hbm, ids_hbm, o_hbm, ids_v, rows_v, table_sh):
        pltpu.sync_copy(table_hbm, table_sh)
        pltpu.sync_copy(ids_hbm, ids_v)
        # Rows of 256 elements between VMEM_SHARED and VMEM: libtpu refuses the gather.
        pltpu.sync_copy(table_sh.at[ids_v], rows_v)
        pltpu.sync_copy(rows_v, o_hbm)

    return kernel(table, ids)


if __name__ == "__main__":
    lanes = pltpu.get_tpu_info().sparse_core.num_lanes
    table = jnp.arange(ROWS * D, dtype=jnp.float32).reshape(ROWS, D)
    ids = (jnp.arange(lanes, dtype=jnp.int32) * 7) % ROWS
    got = np.asarray(jax.jit(lookup)(table, ids))
    print("sc_shared_rows_bug: rows match" if np.array_equal(got, np.asarray(table)[ids])
          else "sc_shared_rows_bug: rows differ (the call never ran)")
