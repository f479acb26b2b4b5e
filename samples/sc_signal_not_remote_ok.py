"""A hand-off between two vector subcores of a SparseCore ordered by a subcore barrier.

Subcore 0 copies a row of x into a VMEM_SHARED buffer; subcore 1 copies it from there,
doubles it and writes the output. A `plsc.subcore_barrier()` orders subcore 0's copy before
subcore 1's (a semaphore signal naming another subcore would stay local on a SparseCore).

Run: pallas-check run samples/sc_signal_not_remote_ok.py --tpu v6e
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc


def hand_off(x):
    L = pltpu.get_tpu_info().sparse_core.num_lanes  # 8 on v6e, 16 on v7x
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=1, num_subcores=2)

    @pl.kernel(out_type=jax.ShapeDtypeStruct((1, L), jnp.float32), mesh=mesh,
               scratch_types=[pltpu.VMEM((1, L), jnp.float32),
                              pltpu.VMEM_SHARED((1, L), jnp.float32)])
    def kernel(x_hbm, o_hbm, row_v, row_sh):
        s = jax.lax.axis_index("subcore")

        @pl.when(s == 0)
        def _():
            pltpu.sync_copy(x_hbm, row_v)
            pltpu.sync_copy(row_v, row_sh)

        plsc.subcore_barrier()

        @pl.when(s == 1)
        def _():
            pltpu.sync_copy(row_sh, row_v)
            row_v[...] = row_v[...] * 2.0
            pltpu.sync_copy(row_v, o_hbm)

    return kernel(x)


if __name__ == "__main__":
    L = pltpu.get_tpu_info().sparse_core.num_lanes
    x = jnp.arange(L, dtype=jnp.float32).reshape(1, L)
    out = jax.jit(hand_off)(x)
    np.testing.assert_allclose(out, 2 * np.asarray(x))
    print("sc_signal_not_remote_ok: output matches")
