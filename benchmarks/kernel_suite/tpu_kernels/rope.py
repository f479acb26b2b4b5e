"""Rotary position embedding (rotate-half form) applied to q or k laid out (heads, seq,
dim); cos / sin tables (seq, dim // 2) shared by every head, or positions prefetched for
decode (one position per sequence, rows of the tables picked by the index map)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def tables(max_len: int, dim: int, base: float = 10000.0) -> tuple[jax.Array, jax.Array]:
    freq = 1.0 / base ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)
    angle = jnp.arange(max_len, dtype=jnp.float32)[:, None] * freq[None, :]
    return jnp.cos(angle), jnp.sin(angle)


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[:, :half], x[:, half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _rope_kernel(x_ref, cos_ref, sin_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    o_ref[...] = _rotate(x, cos_ref[...], sin_ref[...]).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames="block_seq")
def apply_rope(x, cos, sin, block_seq: int = 64):
    heads, seq, dim = x.shape
    half = dim // 2
    x_spec = pl.BlockSpec((None, block_seq, dim), lambda s, h: (h, s, 0))
    table = pl.BlockSpec((block_seq, half), lambda s, h: (s, 0))
    return pl.pallas_call(
        _rope_kernel, grid=(seq // block_seq, heads), in_specs=[x_spec, table, table],
        out_specs=x_spec, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(
        x, cos[:seq], sin[:seq])


def _decode_kernel(positions_ref, x_ref, cos_ref, sin_ref, o_ref):
    del positions_ref  # read by the index maps
    x = x_ref[...].astype(jnp.float32)
    o_ref[...] = _rotate(x, cos_ref[...], sin_ref[...]).astype(o_ref.dtype)


@jax.jit
def apply_rope_decode(x, cos, sin, positions):
    """x (batch, heads, dim): one new token per sequence at `positions[b]`."""
    batch, heads, dim = x.shape
    half = dim // 2
    cos3, sin3 = cos.reshape(-1, 1, half), sin.reshape(-1, 1, half)
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(batch,),
        in_specs=[pl.BlockSpec((None, heads, dim), lambda b, pos: (b, 0, 0)),
                  pl.BlockSpec((None, 1, half), lambda b, pos: (pos[b], 0, 0)),
                  pl.BlockSpec((None, 1, half), lambda b, pos: (pos[b], 0, 0))],
        out_specs=pl.BlockSpec((None, heads, dim), lambda b, pos: (b, 0, 0)))
    return pl.pallas_call(_decode_kernel, grid_spec=grid_spec,
                          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(
        positions, x, cos3, sin3)
