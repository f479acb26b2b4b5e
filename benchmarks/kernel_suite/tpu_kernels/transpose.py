"""Layout changes: a tiled 2-D transpose, and (batch, heads, seq, dim) -> (batch, seq,
heads, dim), the head/sequence swap attention kernels need between layouts."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _transpose_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...].T


@functools.partial(jax.jit, static_argnames=("bm", "bn"))
def transpose(x, bm: int = 128, bn: int = 128):
    m, n = x.shape
    return pl.pallas_call(
        _transpose_kernel, grid=(m // bm, n // bn),
        in_specs=[pl.BlockSpec((bm, bn), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((bn, bm), lambda i, j: (j, i)),
        out_shape=jax.ShapeDtypeStruct((n, m), x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")))(x)


def _swap_kernel(x_ref, o_ref):
    o_ref[...] = jnp.swapaxes(x_ref[...], 0, 1)


@functools.partial(jax.jit, static_argnames="block_seq")
def heads_to_seq_major(x, block_seq: int = 64):
    """(B, H, S, D) -> (B, S, H, D): each step swaps the head and sequence axes of one
    block of rows, every head at once (a block's last two dimensions stay whole)."""
    b, h, s, d = x.shape
    return pl.pallas_call(
        _swap_kernel, grid=(b, s // block_seq),
        in_specs=[pl.BlockSpec((None, h, block_seq, d), lambda bi, si: (bi, 0, si, 0))],
        out_specs=pl.BlockSpec((None, block_seq, h, d), lambda bi, si: (bi, si, 0, 0)),
        out_shape=jax.ShapeDtypeStruct((b, s, h, d), x.dtype))(x)
