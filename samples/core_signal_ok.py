"""Two TensorCores hand each other their halves through HBM: each core writes its half of
`stage`, tells the OTHER core so by signalling that core's semaphore
(`pl.semaphore_signal(ready, 1, core_index=other)`), waits for the other core's word, and
only then reads the other half.

For a chip with two TensorCores (v7x; v4 and v5p as a megacore). A TPU v5e has one: there
the mesh's cores run one after another, core 0 first, and core 0's signal to core 1 never
arrives -- the chip hung on this kernel (hardware/README.md, session 30), and a run on the
v5e (pallas-check's default `--tpu`) reports the deadlock (core_handoff_bug.py shows it).

Run: pallas-check run samples/core_signal_ok.py --tpu v7x --races
Expected findings: none.
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
        pl.semaphore_signal(ready, 1, core_index=other)  # my half of stage is written
        pl.semaphore_wait(ready, 1)  # and so is the other core's
        pltpu.sync_copy(stage_hbm.at[pl.ds(other * 8, 8)], theirs)
        mine[...] = mine[...] + theirs[...]
        pltpu.sync_copy(mine, o_hbm.at[pl.ds(core * 8, 8)])

    return exchange_kernel(x)


if __name__ == "__main__":
    x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
    stage, out = jax.jit(exchange)(x)
    halves = np.asarray(x).reshape(2, 8, 128) * 2.0
    np.testing.assert_allclose(stage, halves.reshape(16, 128))
    np.testing.assert_allclose(out, np.concatenate([halves[0] + halves[1]] * 2))
    print("core_signal_ok: output matches")
