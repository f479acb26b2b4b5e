"""A column sum over row blocks that also sums the padding of the last, partial block.

x has 20 rows; the (8, 128) blocks cover rows 0..24, so the last block (i=2) holds
rows 16..20 of x and 4 rows of padding that no one wrote (on a TPU: stale VMEM). The
kernel sums the whole block, padding included.

Expected finding: kind=uninitialized buffer=x_ref range=[4:8, 0:128] line=28
(the range is in the block's own coordinates: rows 4..8 of the last block are
padding, rows 20..24 of x's padded extent)
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

ROWS = 20


def colsum_kernel(x_ref, o_ref):
    i = pl.program_id(0)

    @pl.when(i == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    # BUG: the last block is partial; its padding rows are summed too.
    block = x_ref[...]
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
    print("uninit_padding_bug: matches reference:",
          bool(np.allclose(out[0], x.sum(axis=0))))
