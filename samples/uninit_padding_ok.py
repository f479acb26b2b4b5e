"""Fixed uninit_padding_bug.py: rows past the end of x are masked out before summing.

The padding rows are still read (as the whole block is), but `jnp.where` replaces them
with zeros, so the result does not depend on them. Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

ROWS = 20


def colsum_kernel(x_ref, o_ref):
    i = pl.program_id(0)

    @pl.when(i == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    rows = i * 8 + lax.broadcasted_iota(jnp.int32, x_ref.shape, 0)
    block = jnp.where(rows < ROWS, x_ref[...], 0.0)
    o_ref[...] += jnp.broadcast_to(jnp.sum(block, axis=0, keepdims=True), o_ref.shape)


def colsum(x):
    return pl.pallas_call(
        colsum_kernel,
        grid=(pl.cdiv(x.shape[0], 8),),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((8, 128), x.dtype),
    )(x)


if __name__ == "__main__":
    x = jnp.arange(ROWS * 128, dtype=jnp.float32).reshape(ROWS, 128)
    out = jax.jit(colsum)(x)
    np.testing.assert_allclose(out, jnp.broadcast_to(x.sum(axis=0), (8, 128)))
    print("uninit_padding_ok: output matches")
