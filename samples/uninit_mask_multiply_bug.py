"""Row sums over column blocks that mask the padded edge block by multiplying with 0/1.

x has 200 columns; the (16, 128) blocks cover columns 0..256, so the last block (j=1)
holds columns 128..200 of x and 56 columns of padding that no one wrote (on a TPU:
stale VMEM). The kernel zeroes them as `x * (col < COLS).astype(f32)`, but a TPU
multiplies: stale NaN or Inf bits times 0 are NaN, and every row sum is poisoned.
(XLA:CPU would rewrite the product into a select and hide it; pallas-check does not.)

Expected finding: kind=uninitialized buffer=x_ref range=[0:16, 72:128] line=32
(the range is in the block's own coordinates: columns 72..128 of the last block are
padding, columns 200..256 of x's padded extent)
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
    # BUG: multiplying by a 0/1 mask keeps the padding's NaN (NaN * 0 = NaN).
    block = x_ref[...] * (col < COLS).astype(jnp.float32)
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
    print("uninit_mask_multiply_bug: matches reference:",
          bool(np.allclose(out[:, 0], x.sum(axis=1), rtol=1e-5)))
