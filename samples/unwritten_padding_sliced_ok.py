"""Padding rows a kernel never writes, sliced off by the caller: nothing to report.

Tokens come in a bucket of 32 rows; only the first `num_tokens` (20) are real. The kernel
runs one grid step per block of real rows (cdiv(20, 8) = 3 steps, rows 0..24) and leaves
the bucket's last block (rows 24..32) unwritten, as a TPU kernel does to save the work.
The jitted caller returns `out[:num_tokens]`: the unwritten rows never reach what the
program keeps, so pallas-check reports nothing (it re-runs the jitted call with other
values in those rows and sees the same result).

Expected findings: none.
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
        grid=(pl.cdiv(num_tokens, BLOCK),),  # only the blocks that hold real tokens
        in_specs=[pl.BlockSpec((BLOCK, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((BLOCK, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)
    return out[:num_tokens]  # the padding rows are dropped here


if __name__ == "__main__":
    x = jnp.arange(BUCKET * 128, dtype=jnp.float32).reshape(BUCKET, 128) / 100.0
    out = scale_tokens(x, num_tokens=20)
    np.testing.assert_allclose(out, np.asarray(x)[:20] * 2.0 + 1.0)
    print("unwritten_padding_sliced_ok: output matches")
