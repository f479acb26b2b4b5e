"""A DMA into a VMEM scratch at row 3: offsets along tiled dimensions must be multiples of
the (8, 128) tile, which Mosaic cannot prove of 3.

Raises: MosaicError
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def gather_kernel(x_hbm, o_ref, buf, sem):
    copy = pltpu.make_async_copy(x_hbm.at[pl.ds(0, 8), pl.ds(0, 128)],
                                 buf.at[pl.ds(3, 8), pl.ds(0, 128)], sem)
    copy.start()  # REFUSED: the DMA starts here
    copy.wait()
    o_ref[...] = buf[pl.ds(3, 8), pl.ds(0, 128)]


def gather(x):
    return pl.pallas_call(
        gather_kernel, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        scratch_shapes=[pltpu.VMEM((16, 256), jnp.float32), pltpu.SemaphoreType.DMA],
        out_shape=jax.ShapeDtypeStruct((8, 128), x.dtype))(x)


if __name__ == "__main__":
    try:
        jax.jit(gather)(jnp.ones((32, 256), jnp.float32))
    except Exception as exc:
        print("raised", type(exc).__name__)
        raise
