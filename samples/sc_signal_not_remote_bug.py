"""A hand-off between two vector subcores of a SparseCore by a semaphore signal naming the
other subcore.

Subcore 0 copies a row of x into a VMEM_SHARED buffer; subcore 1 copies it from there,
doubles it and writes the output. BUG: subcore 0 tells subcore 1 with
`pl.semaphore_signal(sem, device_id={"core": 0, "subcore": 1})` and subcore 1 waits on its
sem. In a VectorSubcoreMesh kernel Mosaic lowers that signal to a LOCAL one (tpu.sem_signal
with no core or subcore operand): subcore 0 signals its own sem, and subcore 1 waits forever
(on the chip the kernel hangs).

Run: pallas-check run samples/sc_signal_not_remote_bug.py --tpu v6e
Expected finding: kind=signal-not-remote buffer=sem line=39 args=--tpu v6e
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
                              pltpu.VMEM_SHARED((1, L), jnp.float32),
                              pltpu.SemaphoreType.REGULAR])
    def kernel(x_hbm, o_hbm, row_v, row_sh, sem):
        s = jax.lax.axis_index("subcore")

        @pl.when(s == 0)
        def _():
            pltpu.sync_copy(x_hbm, row_v)
            pltpu.sync_copy(row_v, row_sh)
            pl.semaphore_signal(sem, 1, device_id={"core": 0, "subcore": 1})  # BUG: local

        @pl.when(s == 1)
        def _():
            pl.semaphore_wait(sem, 1)
            pltpu.sync_copy(row_sh, row_v)
            row_v[...] = row_v[...] * 2.0
            pltpu.sync_copy(row_v, o_hbm)

    return kernel(x)


if __name__ == "__main__":
    L = pltpu.get_tpu_info().sparse_core.num_lanes
    x = jnp.arange(L, dtype=jnp.float32).reshape(1, L)
    out = jax.jit(hand_off)(x)
    print("sc_signal_not_remote_bug: matches reference:", bool(np.allclose(out, 2 * x)))
