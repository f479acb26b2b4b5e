"""A DMA that is started and never waited on.

The kernel copies x to the output in HBM with an async copy and returns without
`copy.wait()`. On a TPU the kernel can finish (and the output be read) before the
copy lands, and the DMA semaphore is left non-zero.

Expected finding: kind=dma-not-waited buffer=o_hbm range=[0:8, 0:128] line=21
(buffer and range are the DMA's destination)
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def copy_kernel(x_hbm, o_hbm, sem):
    copy = pltpu.make_async_copy(x_hbm, o_hbm, sem)
    # BUG: no copy.wait() after the start.
    copy.start()


def hbm_copy(x):
    return pl.pallas_call(
        copy_kernel,
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.SemaphoreType.DMA],
    )(x)


if __name__ == "__main__":
    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
    out = jax.jit(hbm_copy)(x)
    print("dma_not_waited_bug: out[0, :4] =", np.asarray(out)[0, :4])
