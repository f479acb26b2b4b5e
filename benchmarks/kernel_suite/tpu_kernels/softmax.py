"""Row softmax, and a masked softmax whose valid lengths per row block come from a
scalar-prefetch operand (a padded batch of sequences)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _softmax_kernel(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = (e / jnp.sum(e, axis=-1, keepdims=True)).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames="block_rows")
def softmax(x: jax.Array, block_rows: int = 8) -> jax.Array:
    rows, width = x.shape
    spec = pl.BlockSpec((block_rows, width), lambda i: (i, 0))
    return pl.pallas_call(_softmax_kernel, grid=(rows // block_rows,), in_specs=[spec],
                          out_specs=spec, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def _masked_kernel(lengths_ref, x_ref, o_ref):
    length = lengths_ref[pl.program_id(0)]
    x = x_ref[...].astype(jnp.float32)
    column = jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)
    x = jnp.where(column < length, x, -jnp.inf)
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = (e / jnp.sum(e, axis=-1, keepdims=True)).astype(o_ref.dtype)


@jax.jit
def masked_softmax(x: jax.Array, lengths: jax.Array) -> jax.Array:
    """x (batch, rows, width); each batch entry's columns at and past its length are out."""
    batch, rows, width = x.shape
    spec = pl.BlockSpec((None, rows, width), lambda b, lengths: (b, 0, 0))
    return pl.pallas_call(
        _masked_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(batch,),
                                               in_specs=[spec], out_specs=spec),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(lengths, x)
