"""`pl.Element` block dimensions padded below (`pl.Element(8, (2, 0))`): windows that
start before the array. Mosaic sets no window with low padding.

Raises: JaxRuntimeError
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def shifted(x):
    return pl.pallas_call(  # REFUSED
        copy_kernel, grid=(4,),
        in_specs=[pl.BlockSpec((pl.Element(8, (2, 0)), pl.Element(128)),
                               lambda i: (i * 8, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


if __name__ == "__main__":
    try:
        jax.jit(shifted)(jnp.ones((32, 128), jnp.float32))
    except Exception as exc:
        print("raised", type(exc).__name__)
        raise
