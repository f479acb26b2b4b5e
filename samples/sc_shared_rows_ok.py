"""A SparseCore lookup of rows of 256 floats staged in VMEM_SHARED as 128-column blocks.

As sc_shared_rows_bug.py, but the caller lays the (64, 256) f32 table out as two (64, 128)
column blocks, and the subcore gathers each block's rows (rows of 128 elements, which
libtpu moves between VMEM_SHARED and VMEM) and writes them to that block of the output;
the caller puts the blocks back side by side. libtpu 0.0.42 compiles it for v6e and v7x.

Run: pallas-check run samples/sc_shared_rows_ok.py --tpu v6e
Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

ROWS, D, COLUMNS = 64, 256, 128
BLOCKS = D // COLUMNS


def lookup(table, ids):
    lanes = ids.shape[0]
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=1, num_subcores=1)
    blocks = table.reshape(ROWS, BLOCKS, COLUMNS).transpose(1, 0, 2)

    @pl.kernel(out_type=jax.ShapeDtypeStruct((BLOCKS, lanes, COLUMNS), table.dtype),
               mesh=mesh,
               scratch_types=[pltpu.VMEM((lanes,), jnp.int32),
                              pltpu.VMEM((lanes, COLUMNS), table.dtype),
                              pltpu.VMEM_SHARED((BLOCKS, ROWS, COLUMNS), table.dtype)])
    def kernel(blocks_hbm, ids_hbm, o_hbm, ids_v, rows_v, blocks_sh):
        pltpu.sync_copy(blocks_hbm, blocks_sh)
        pltpu.sync_copy(ids_hbm, ids_v)
        for b in range(BLOCKS):
            pltpu.sync_copy(blocks_sh.at[b].at[ids_v], rows_v)  # rows of 128 elements
            pltpu.sync_copy(rows_v, o_hbm.at[b])

    return kernel(blocks, ids).transpose(1, 0, 2).reshape(lanes, D)


if __name__ == "__main__":
    lanes = pltpu.get_tpu_info().sparse_core.num_lanes
    table = jnp.arange(ROWS * D, dtype=jnp.float32).reshape(ROWS, D)
    ids = (jnp.arange(lanes, dtype=jnp.int32) * 7) % ROWS
    got = np.asarray(jax.jit(lookup)(table, ids))
    np.testing.assert_array_equal(got, np.asarray(table)[np.asarray(ids)])
    print("sc_shared_rows_ok: output matches")
