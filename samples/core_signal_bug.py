"""Two TensorCores hand each other their halves, but both signal core 0's semaphore.

`core_index=0` where `core_index=1 - core` was meant: core 0's `ready` gets both words and
core 1's none, so core 1 waits for a signal that never comes (on a TPU: a hang).

Expected finding: kind=deadlock buffer=ready line=32
(line 32 is core 1's wait; before pallas-check honoured core_index, every signal went to
the signalling core's own semaphore, and nothing was found)
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

MESH = pltpu.create_tensorcore_mesh("core", num_cores=2)
HALF = jax.ShapeDtypeStruct((16, 128), jnp.float32)


def exchange(x):
    @pl.kernel(out_type=(HALF, HALF), mesh=MESH,
               scratch_types=[pltpu.VMEM((8, 128), jnp.float32),
                              pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.REGULAR])
    def exchange_kernel(x_hbm, stage_hbm, o_hbm, mine, theirs, ready):
        core = jax.lax.axis_index("core")
        other = 1 - core
        pltpu.sync_copy(x_hbm.at[pl.ds(core * 8, 8)], mine)
        mine[...] = mine[...] * 2.0
        pltpu.sync_copy(mine, stage_hbm.at[pl.ds(core * 8, 8)])
        pl.semaphore_signal(ready, 1, core_index=0)  # BUG: core_index=other
        pl.semaphore_wait(ready, 1)
        pltpu.sync_copy(stage_hbm.at[pl.ds(other * 8, 8)], theirs)
        mine[...] = mine[...] + theirs[...]
        pltpu.sync_copy(mine, o_hbm.at[pl.ds(core * 8, 8)])

    return exchange_kernel(x)


if __name__ == "__main__":
    x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
    stage, out = jax.jit(exchange)(x)
    halves = np.asarray(x).reshape(2, 8, 128) * 2.0
    print("core_signal_bug: output matches"
          if np.allclose(out, np.concatenate([halves[0] + halves[1]] * 2))
          else "core_signal_bug: output is wrong")
