"""A kernel stores its result in 8-row chunks and runs one chunk too many.

The output block is (16, 128): two chunks of 8 rows. The loop's trip count is taken
from the *input* block (24 rows), so its third iteration stores rows 16..24, past the
end of the output block (on a TPU it overwrites whatever follows the block in VMEM).

Expected finding: kind=out-of-bounds buffer=o_ref range=[16:24, 0:128] line=26
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

CHUNK = 8


def chunk_sum_kernel(x_ref, o_ref):
    # BUG: x_ref has 24 rows, o_ref only 16; the loop bound should come from o_ref.
    n_chunks = x_ref.shape[0] // CHUNK

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
    print("oob_store_bug: out[0, :4] =", np.asarray(out)[0, :4])
