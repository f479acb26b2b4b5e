"""Fixed unwritten_grid_bug.py: the grid has one step per output block.

Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl


def double_kernel(x_ref, o_ref):
    o_ref[...] = 2.0 * x_ref[...]


def double(x):
    n_blocks = x.shape[0] // 8
    return pl.pallas_call(
        double_kernel,
        grid=(n_blocks,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)


if __name__ == "__main__":
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    out = jax.jit(double)(x)
    np.testing.assert_allclose(out, 2.0 * x)
    print("unwritten_grid_ok: output matches")
