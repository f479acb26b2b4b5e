"""Two TensorCores hand each other their halves, but both signal core 0's semaphore.

`core_index=0` where `core_index=1 - core` was meant: core 0's `ready` gets both words and
core 1's none, so core 1 waits for a signal that never comes (on a two-TensorCore chip
such as the v7x: a hang).

On a TPU v5e (one TensorCore, pallas-check's default `--tpu`) the kernel does not hang:
the cores run one after another, and core 1's signal to core 0 -- the chip's one core,
running core 1 -- reaches core 1's own `ready` (the chip finished it so in session 30,
with a wrong output). There core 0 reads core 1's half of `stage` before core 1 has
written it.

Expected finding: kind=deadlock buffer=ready line=41 args=--tpu v7x
Expected finding: kind=uninitialized buffer=theirs range=[0:8, 0:128] line=43
(line 41 is core 1's wait; before pallas-check honoured core_index, every signal went to
the signalling core's own semaphore, and nothing was found. Line 43 adds what core 0
copied from the unwritten half of `stage` into its output rows)
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
