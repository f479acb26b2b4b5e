"""Fixed uninit_mask_multiply_bug.py: the padded columns are selected away, not multiplied.

The padding of the last block is still read, but `jnp.where` replaces it with zeros
whatever it holds (NaN included), so the row sums do not depend on it.
Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

COLS = 200


def rowsum_kernel(x_ref, o_ref):
    j = pl.program_id(0)

    @pl.when(j == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    col = j * 128 + lax.broadcasted_iota(jnp.int32, x_ref.shape, 1)
    block = jnp.where(col < COLS, x_ref[...], 0.0)
    o_ref[...] += jnp.broadcast_to(jnp.sum(block, axis=1, keepdims=True), o_ref.shape)


def rowsum(x):
    return pl.pallas_call(
        rowsum_kernel,
        grid=(pl.cdiv(x.shape[1], 128),),
        in_specs=[pl.BlockSpec((16, 128), lambda j: (0, j))],
        out_specs=pl.BlockSpec((16, 128), lambda j: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((16, 128), x.dtype),
    )(x)


if __name__ == "__main__":
    x = jnp.arange(16 * COLS, dtype=jnp.float32).reshape(16, COLS) / 1000
    out = jax.jit(rowsum)(x)
    np.testing.assert_allclose(out, jnp.broadcast_to(x.sum(axis=1, keepdims=True), (16, 128)),
                               rtol=1e-5)
    print("uninit_mask_multiply_ok: output matches")
