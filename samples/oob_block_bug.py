"""A BlockSpec index_map selects a block that lies entirely outside the array.

The kernel adds each block of x to the *next* block of y. The index_map for y,
lambda i: (i + 1, 0), has no wrap-around: at the last grid step (i=3) it selects
block 4 of y, rows 32..40, while y has only 32 rows.

Expected finding: kind=out-of-bounds buffer=y_ref range=[32:40, 0:128] line=27
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl


def add_next_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]


def add_next(x, y):
    n = x.shape[0] // 8
    return pl.pallas_call(
        add_next_kernel,
        grid=(n,),
        in_specs=[
            pl.BlockSpec((8, 128), lambda i: (i, 0)),
            pl.BlockSpec((8, 128), lambda i: (i + 1, 0)),  # BUG: no wrap at the end
        ],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x, y)


if __name__ == "__main__":
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    y = jnp.ones_like(x)
    out = jax.jit(add_next)(x, y)
    print("oob_block_bug: out[-1, :4] =", np.asarray(out)[-1, :4])
