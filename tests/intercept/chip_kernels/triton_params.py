"""Triton's compiler params (`pltriton.CompilerParams`) on a TPU pallas_call: the TPU
lowering asserts its params are Mosaic's (an AssertionError without a message).

Raises: AssertionError
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton


def copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def copy(x):
    return pl.pallas_call(  # REFUSED
        copy_kernel, grid=(2,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        compiler_params=pltriton.CompilerParams(num_warps=4))(x)


if __name__ == "__main__":
    try:
        jax.jit(copy)(jnp.ones((16, 128), jnp.float32))
    except Exception as exc:
        print("raised", type(exc).__name__)
        raise
