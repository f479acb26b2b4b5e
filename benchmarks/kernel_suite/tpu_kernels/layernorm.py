"""LayerNorm and RMSNorm over the last axis, with a learnt scale (and bias)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _layernorm_kernel(x_ref, gamma_ref, beta_ref, o_ref, *, eps: float):
    x = x_ref[...].astype(jnp.float32)
    mean = jnp.mean(x, axis=-1, keepdims=True)
    centred = x - mean
    var = jnp.mean(centred * centred, axis=-1, keepdims=True)
    y = centred * jax.lax.rsqrt(var + eps)
    o_ref[...] = (y * gamma_ref[...] + beta_ref[...]).astype(o_ref.dtype)


def _rmsnorm_kernel(x_ref, gamma_ref, o_ref, *, eps: float):
    x = x_ref[...].astype(jnp.float32)
    y = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
    o_ref[...] = (y * gamma_ref[...]).astype(o_ref.dtype)


def _specs(x: jax.Array, block_rows: int, params: int):
    rows, width = x.shape
    row = pl.BlockSpec((block_rows, width), lambda i: (i, 0))
    vector = pl.BlockSpec((1, width), lambda i: (0, 0))
    return rows // block_rows, [row] + [vector] * params, row


@functools.partial(jax.jit, static_argnames=("eps", "block_rows"))
def layernorm(x, gamma, beta, eps: float = 1e-5, block_rows: int = 16):
    steps, in_specs, out_spec = _specs(x, block_rows, 2)
    return pl.pallas_call(functools.partial(_layernorm_kernel, eps=eps), grid=(steps,),
                          in_specs=in_specs, out_specs=out_spec,
                          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(
        x, gamma.reshape(1, -1).astype(jnp.float32), beta.reshape(1, -1).astype(jnp.float32))


@functools.partial(jax.jit, static_argnames=("eps", "block_rows"))
def rmsnorm(x, gamma, eps: float = 1e-6, block_rows: int = 16):
    steps, in_specs, out_spec = _specs(x, block_rows, 1)
    return pl.pallas_call(functools.partial(_rmsnorm_kernel, eps=eps), grid=(steps,),
                          in_specs=in_specs, out_specs=out_spec,
                          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(
        x, gamma.reshape(1, -1).astype(jnp.float32))
