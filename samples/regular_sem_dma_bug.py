"""A regular semaphore waited for the DMAs' byte count, as if it were a DMA semaphore.

A DMA adds one to a REGULAR semaphore on v6e (JAX's tests; unverified on a chip; a v5e
adds bytes/32), whatever its size; the kernel waits for 8192, the count never gets past 2:
the kernel hangs.

Run: pallas-check run samples/regular_sem_dma_bug.py --tpu v6e
Expected finding: kind=deadlock buffer=sem line=21
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def double_kernel(x_hbm, o_hbm, buf, sem):
    pltpu.async_copy(x_hbm.at[0], buf.at[0], sem)
    pltpu.async_copy(x_hbm.at[1], buf.at[1], sem)
    pl.semaphore_wait(sem, 2 * 8 * 128 * 4)  # BUG: counts DMAs, not bytes: wait(sem, 2)
    buf[...] = buf[...] * 2.0
    pltpu.async_copy(buf, o_hbm, sem)
    pl.semaphore_wait(sem, 1)


def double(x):
    return pl.pallas_call(
        double_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        scratch_shapes=[pltpu.VMEM((2, 8, 128), jnp.float32), pltpu.SemaphoreType.REGULAR],
    )(x)


if __name__ == "__main__":
    x = jnp.arange(2 * 8 * 128, dtype=jnp.float32).reshape(2, 8, 128)
    out = jax.jit(double)(x)
    print("regular_sem_dma_bug: output matches" if np.allclose(out, np.asarray(x) * 2)
          else "regular_sem_dma_bug: output is wrong")
