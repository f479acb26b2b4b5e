"""DMAs that signal a REGULAR semaphore (TPU v6+ in JAX's tests): each DMA adds one to it,
not its byte count, so two copies in flight are waited with `pl.semaphore_wait(sem, 2)`
and the copy back with `pl.semaphore_wait(sem, 1)`.

Run: pallas-check run samples/regular_sem_dma_ok.py --tpu v6e --races
Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def double_kernel(x_hbm, o_hbm, buf, sem):
    pltpu.async_copy(x_hbm.at[0], buf.at[0], sem)
    pltpu.async_copy(x_hbm.at[1], buf.at[1], sem)
    pl.semaphore_wait(sem, 2)  # one count per DMA: both halves have landed
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
    np.testing.assert_allclose(out, np.asarray(x) * 2)
    print("regular_sem_dma_ok: output matches")
