"""Fixed oob_block_bug.py: the index_map wraps around, lambda i: ((i + 1) % n, 0).

Each block of x gets the next block of y added, the last one the first block.
Expected findings: none.
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
            pl.BlockSpec((8, 128), lambda i: ((i + 1) % n, 0)),
        ],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x, y)


if __name__ == "__main__":
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    y = 1000.0 * jnp.arange(32, dtype=jnp.float32)[:, None] + jnp.zeros_like(x)
    out = jax.jit(add_next)(x, y)
    np.testing.assert_allclose(out, x + jnp.roll(y, -8, axis=0))
    print("oob_block_ok: output matches")
