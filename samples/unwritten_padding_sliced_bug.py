"""A grid that stops one block short of the real tokens: the caller keeps unwritten rows.

Tokens come in a bucket of 32 rows; the first `num_tokens` (20) are real. The grid is
`num_tokens // 8` (2 steps, rows 0..16) where it should be `cdiv(num_tokens, 8)`, so rows
16..20 -- real tokens -- are never written, together with the padding rows 16..32. The
caller's `out[:num_tokens]` drops the padding (rows 20..32: no defect there) but keeps
rows 16..20, which hold whatever HBM held on a TPU: the finding names the kernel's
unwritten elements and the result elements they reach (result 0, rows 16..20).

Expected finding: kind=unwritten-output buffer=o_ref range=[16:32, 0:128] line=25
(an unwritten element has no statement of its own: the line is the kernel's `def`)
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

BUCKET = 32
BLOCK = 8


def scale_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0 + 1.0


@functools.partial(jax.jit, static_argnames="num_tokens")
def scale_tokens(x, num_tokens):
    out = pl.pallas_call(
        scale_kernel,
        grid=(num_tokens // BLOCK,),  # BUG: should be pl.cdiv(num_tokens, BLOCK)
        in_specs=[pl.BlockSpec((BLOCK, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((BLOCK, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)
    return out[:num_tokens]


if __name__ == "__main__":
    x = jnp.arange(BUCKET * 128, dtype=jnp.float32).reshape(BUCKET, 128) / 100.0
    out = scale_tokens(x, num_tokens=20)
    print("unwritten_padding_sliced_bug: rows 16..20 match:",
          bool(np.allclose(np.asarray(out)[16:], np.asarray(x)[16:20] * 2.0 + 1.0)))
