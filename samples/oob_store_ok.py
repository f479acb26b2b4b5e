"""Fixed oob_store_bug.py: the loop bound comes from the output block (16 rows).

Each grid step adds 1 to the first 16 of its 24 input rows and stores them in 8-row
chunks. Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

CHUNK = 8


def chunk_sum_kernel(x_ref, o_ref):
    n_chunks = o_ref.shape[0] // CHUNK

    def body(c, carry):
        row = pl.multiple_of(c * CHUNK, CHUNK)
        chunk = x_ref[pl.ds(row, CHUNK), :] + 1.0
        o_ref[pl.ds(row, CHUNK), :] = chunk
        return carry

    lax.fori_loop(0, n_chunks, body, 0)


def chunk_copy(x):
    return pl.pallas_call(
        chunk_sum_kernel,
        grid=(2,),
        in_specs=[pl.BlockSpec((24, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((16, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((32, 128), x.dtype),
    )(x)


if __name__ == "__main__":
    x = jnp.arange(48 * 128, dtype=jnp.float32).reshape(48, 128)
    out = jax.jit(chunk_copy)(x)
    expected = jnp.concatenate([x[0:16], x[24:40]]) + 1.0
    np.testing.assert_allclose(out, expected)
    print("oob_store_ok: output matches")
