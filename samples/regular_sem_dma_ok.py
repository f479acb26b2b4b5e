"""DMAs that signal a REGULAR semaphore, waited with the count each generation's chip adds.

A DMA adds to a regular semaphore what the chip counts: on a TPU v5e its byte count / 32
(an (8, 128) float32 copy: 128), measured on the chip (hardware/README.md); one per DMA on
TPU v6+ (JAX's tests; not measured here). The kernel asks which chip it runs on and waits
for both halves (two DMAs) and then for the copy back.

Run: pallas-check run samples/regular_sem_dma_ok.py --races
Expected findings: none (also with --tpu v6e).
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def dma_count(nbytes):
    """What one DMA of `nbytes` adds to a regular semaphore on the chip this runs on."""
    return nbytes // 32 if jax.devices()[0].device_kind.startswith("TPU v5") else 1


def double_kernel(x_hbm, o_hbm, buf, sem):
    half = 8 * 128 * 4
    pltpu.async_copy(x_hbm.at[0], buf.at[0], sem)
    pltpu.async_copy(x_hbm.at[1], buf.at[1], sem)
    pl.semaphore_wait(sem, 2 * dma_count(half))  # both halves have landed
    buf[...] = buf[...] * 2.0
    pltpu.async_copy(buf, o_hbm, sem)
    pl.semaphore_wait(sem, dma_count(2 * half))


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
