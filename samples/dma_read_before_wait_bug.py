"""A kernel reads a DMA's destination before waiting for the DMA.

x stays in HBM; the kernel starts a copy of it into a VMEM scratch buffer, reads the
buffer, and only then waits. On a TPU the read races with the copy and may see stale
VMEM. The finding needs the DMA to land no earlier than its wait: under
`--dma on_wait` (the default) the read sees never-written memory; under `--dma eager`
the copy is done at its start and the read happens to see the data (no finding).

Expected finding: kind=uninitialized buffer=buf range=[0:8, 0:128] line=25 args=--dma on_wait
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
    # BUG: buf is read before copy.wait(): the copy may not have landed yet.
    y = buf[...] * 2.0
    copy.wait()
    o_ref[...] = y


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
    print("dma_read_before_wait_bug: matches reference:",
          bool(np.allclose(out, 2.0 * x)))
