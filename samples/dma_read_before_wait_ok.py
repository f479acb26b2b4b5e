"""Fixed dma_read_before_wait_bug.py: the destination is read after copy.wait().

Expected findings: none (under either --dma mode).
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def load_kernel(x_hbm, o_ref, buf, sem):
    i = pl.program_id(0)
    start = pl.multiple_of(i * 8, 8)
    copy = pltpu.make_async_copy(x_hbm.at[pl.ds(start, 8), :], buf, sem)
    copy.start()
    copy.wait()
    o_ref[...] = buf[...] * 2.0


def load_double(x):
    return pl.pallas_call(
        load_kernel,
        grid=(x.shape[0] // 8,),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA],
    )(x)


if __name__ == "__main__":
    x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
    out = jax.jit(load_double)(x)
    np.testing.assert_allclose(out, 2.0 * x)
    print("dma_read_before_wait_ok: output matches")
