"""A DMA that signals a REGULAR semaphore on a TPU v5e, waited once "per DMA".

On a v5e a DMA adds its byte count / 32 to the regular semaphore it signals, as it does to
a DMA semaphore (measured on the chip: an (8, 128) float32 copy adds 128), not one, as
TPU v6+ does per JAX's tests. The kernel waits 1 after each copy: the first wait passes at
once, the doubling may read the block before it lands, the copy back is never waited for,
and the semaphore ends the kernel at 254 -- on the chip the core halts ("Semaphore ... has
a nonzero value upon exit from a Mosaic kernel", recorded in hardware/recordings/).

Run: pallas-check run samples/regular_sem_v5e_bug.py
Expected finding: kind=dma-not-waited buffer=buf range=[0:8, 0:128] line=25
Expected finding: kind=dma-not-waited buffer=o_hbm range=[0:8, 0:128] line=28
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_BYTES = 8 * 128 * 4


def double_kernel(x_hbm, o_hbm, buf, sem):
    pltpu.async_copy(x_hbm, buf, sem)
    pl.semaphore_wait(sem, 1)  # BUG: a v5e adds 128 for these 4096 bytes, not 1
    buf[...] = buf[...] * 2.0
    pltpu.async_copy(buf, o_hbm, sem)
    pl.semaphore_wait(sem, 1)


def double(x):
    return pl.pallas_call(
        double_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.REGULAR],
    )(x)


if __name__ == "__main__":
    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
    out = jax.jit(double)(x)
    np.testing.assert_allclose(out, np.asarray(x) * 2)
    print("regular_sem_v5e_bug: output matches")
