"""A BlockSpec the TPU cannot tile: (4, 128) f32 blocks of a (32, 128) array.

The kernel is right and the simulation finds nothing, but on a TPU it never builds: the
Pallas TPU lowering needs the last two block dimensions to be multiples of (8, 128) (or the
whole array's). `--compile` compiles the call for the TPU and reports it at the
pallas_call, naming the operand.

Expected finding: kind=compile-error buffer=x_ref line=23 generation=v5e args=--compile --tpu v5e
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl


def scale_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0


def scale(x):
    rows = 4  # BUG: 4 rows of f32 are half a (8, 128) tile
    return pl.pallas_call(
        scale_kernel,
        grid=(x.shape[0] // rows,),
        in_specs=[pl.BlockSpec((rows, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((rows, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)


if __name__ == "__main__":
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    np.testing.assert_allclose(jax.jit(scale)(x), x * 2.0)
    print("compile_block_shape_bug: output matches")
