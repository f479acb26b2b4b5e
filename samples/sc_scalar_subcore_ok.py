"""A kernel over the scalar subcores of the SparseCores: expected findings: none.

Run: pallas-check run samples/sc_scalar_subcore_ok.py --tpu v6e

`pl.kernel` over a `plsc.ScalarSubcoreMesh`: one actor per SparseCore of the chip (its
scalar subcore, `sparsecore 1 scalar subcore`), with no VMEM of its own: SparseCore `core`
copies its half of x into ITS VMEM_SHARED (one per SparseCore) and from there into the
output, by DMA.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

ROWS_PER_CORE = 8


def copy_through_shared(x):
    mesh = plsc.ScalarSubcoreMesh(axis_name="core")  # every SparseCore of the chip

    @pl.kernel(out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), mesh=mesh,
               scratch_types=[pltpu.VMEM_SHARED((ROWS_PER_CORE, x.shape[1]), x.dtype)])
    def kernel(x_hbm, o_hbm, shared):
        core = jax.lax.axis_index("core")
        rows = pl.ds(core * ROWS_PER_CORE, ROWS_PER_CORE)
        pltpu.sync_copy(x_hbm.at[rows], shared)
        pltpu.sync_copy(shared, o_hbm.at[rows])

    return kernel(x)


if __name__ == "__main__":
    num_cores = plsc.get_sparse_core_info().num_cores  # 2 on v6e and v7x, 4 on v5p
    x = jnp.arange(num_cores * ROWS_PER_CORE * 128, dtype=jnp.float32).reshape(-1, 128)
    out = jax.jit(copy_through_shared)(x)
    np.testing.assert_allclose(np.asarray(out), np.asarray(x))
    print("sc_scalar_subcore_ok: output matches")
