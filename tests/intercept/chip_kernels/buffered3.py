"""A top-level `pl.Buffered(3)` on a pallas_call's BlockSpec: a TPU pallas_call pipelines
its blocks with one or two buffers only (three are for `pltpu.emit_pipeline`).

Raises: LoweringException
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def copy(x):
    return pl.pallas_call(  # REFUSED
        copy_kernel, grid=(4,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0), pipeline_mode=pl.Buffered(3))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


if __name__ == "__main__":
    try:
        jax.jit(copy)(jnp.ones((32, 128), jnp.float32))
    except Exception as exc:
        print("raised", type(exc).__name__)
        raise
