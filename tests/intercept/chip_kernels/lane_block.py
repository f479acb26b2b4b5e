"""(1, 16) blocks of a (1, 4096) array: the last block dimension must be a multiple of 128
or the array's whole dimension (the 8 x 128 rule).

Raises: ValueError
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def copy(x):
    return pl.pallas_call(  # REFUSED
        copy_kernel, grid=(x.shape[1] // 16,),
        in_specs=[pl.BlockSpec((1, 16), lambda i: (0, i))],
        out_specs=pl.BlockSpec((1, 16), lambda i: (0, i)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


if __name__ == "__main__":
    try:
        jax.jit(copy)(jnp.ones((1, 4096), jnp.float32))
    except Exception as exc:
        print("raised", type(exc).__name__)
        raise
