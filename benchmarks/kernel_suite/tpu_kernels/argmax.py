"""Row-wise argmax and top-k (k small: k rounds of max and mask), indices as int32."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _first_max_index(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Each row's maximum and the lowest column holding it."""
    column = jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)
    best = jnp.max(x, axis=-1, keepdims=True)
    index = jnp.min(jnp.where(x == best, column, x.shape[-1]), axis=-1, keepdims=True)
    return best, index


def _argmax_kernel(x_ref, o_ref):
    _, index = _first_max_index(x_ref[...].astype(jnp.float32))
    o_ref[...] = index


@functools.partial(jax.jit, static_argnames="block_rows")
def argmax(x: jax.Array, block_rows: int = 8) -> jax.Array:
    rows, cols = x.shape
    return pl.pallas_call(
        _argmax_kernel, grid=(rows // block_rows,),
        in_specs=[pl.BlockSpec((block_rows, cols), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((block_rows, 1), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((rows, 1), jnp.int32))(x)[:, 0]


def _topk_kernel(x_ref, values_ref, indices_ref, *, k: int):
    x = x_ref[...].astype(jnp.float32)
    column = jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)
    values, indices = [], []
    for _ in range(k):
        best, index = _first_max_index(x)
        values.append(best)
        indices.append(index)
        x = jnp.where(column == index, -jnp.inf, x)
    values_ref[...] = jnp.concatenate(values, axis=-1).astype(values_ref.dtype)
    indices_ref[...] = jnp.concatenate(indices, axis=-1)


@functools.partial(jax.jit, static_argnames=("k", "block_rows"))
def top_k(x: jax.Array, k: int, block_rows: int = 8) -> tuple[jax.Array, jax.Array]:
    rows, cols = x.shape
    out = pl.BlockSpec((block_rows, k), lambda i: (i, 0))
    return pl.pallas_call(
        functools.partial(_topk_kernel, k=k), grid=(rows // block_rows,),
        in_specs=[pl.BlockSpec((block_rows, cols), lambda i: (i, 0))],
        out_specs=[out, out],
        out_shape=[jax.ShapeDtypeStruct((rows, k), x.dtype),
                   jax.ShapeDtypeStruct((rows, k), jnp.int32)])(x)
