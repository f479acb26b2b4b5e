"""Core 0 hands its partial sum to core 1 of a two-TensorCore mesh, and waits for nothing.

Core 0 writes its rows' part into the output and signals core 1's semaphore
(`pl.semaphore_signal(ready, 1, core_index=1)`); core 1 waits for that word, adds its own
part and writes the total. Right on a chip with two TensorCores (`--tpu v7x`: clean). On a
TPU v5e, pallas-check's default chip, it hangs: the v5e has one TensorCore, which runs the
mesh's cores one after another (core 0 first), and core 0's signal to core 1 -- a core the
chip does not have -- never arrives, so core 1 waits forever (the chip hung so on session
30's probe `forward`, hardware/README.md). The report's help says why and what to do.

Expected finding: kind=deadlock buffer=ready line=39
(line 39 is core 1's wait; the fix, core_handoff_ok.py, hands nothing from core to core)
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

MESH = pltpu.create_tensorcore_mesh("core", num_cores=2)


def total(x):
    @pl.kernel(out_type=jax.ShapeDtypeStruct((8, 128), jnp.float32), mesh=MESH,
               scratch_types=[pltpu.VMEM((8, 128), jnp.float32),
                              pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.REGULAR])
    def handoff_kernel(x_hbm, o_hbm, mine, theirs, ready):
        core = jax.lax.axis_index("core")
        pltpu.sync_copy(x_hbm.at[pl.ds(core * 8, 8)], mine)

        @pl.when(core == 0)
        def _():
            pltpu.sync_copy(mine, o_hbm)  # core 0's part, staged in the output
            pl.semaphore_signal(ready, 1, core_index=1)  # BUG on a one-TensorCore chip

        @pl.when(core == 1)
        def _():
            pl.semaphore_wait(ready, 1)  # core 0's part is in o_hbm
            pltpu.sync_copy(o_hbm, theirs)
            mine[...] = mine[...] + theirs[...]
            pltpu.sync_copy(mine, o_hbm)

    return handoff_kernel(x)


if __name__ == "__main__":
    x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
    out = jax.jit(total)(x)
    print("core_handoff_bug: output", "matches" if np.allclose(out, x[:8] + x[8:])
          else "is wrong")
