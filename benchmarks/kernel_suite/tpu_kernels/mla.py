"""Multi-head latent attention, decode: the query already absorbed into the latent space
(q_latent (B, H, C)) plus its rotary part (q_rope (B, H, R)); the cache holds one latent
vector (C) and one rotary key (R) per token, shared by every head. Scores are
q_latent·c + q_rope·k_rope; the output stays in the latent space (B, H, C)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

NEG_INF = -1e30
HIGHEST = jax.lax.Precision.HIGHEST


def _kernel(lengths_ref, ql_ref, qr_ref, c_ref, kr_ref, o_ref, m_ref, l_ref, acc_ref, *,
            block_kv: int, sm_scale: float):
    b, step = pl.program_id(0), pl.program_id(1)
    length = lengths_ref[b]

    @pl.when(step == 0)
    def _():
        m_ref[...] = jnp.full_like(m_ref, NEG_INF)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(step * block_kv < length)
    def _():
        latent = c_ref[...].astype(jnp.float32)
        contract = (((1,), (1,)), ((), ()))
        s = jax.lax.dot_general(ql_ref[...].astype(jnp.float32), latent, contract,
                                precision=HIGHEST)
        s += jax.lax.dot_general(qr_ref[...].astype(jnp.float32),
                                 kr_ref[...].astype(jnp.float32), contract, precision=HIGHEST)
        s = s * sm_scale
        position = step * block_kv + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
        s = jnp.where(position < length, s, NEG_INF)
        m_prev = m_ref[...]
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
        p = jnp.exp(s - m_new)
        alpha = jnp.exp(m_prev - m_new)
        l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=-1, keepdims=True)
        acc_ref[...] = alpha * acc_ref[...] + jnp.dot(p, latent, precision=HIGHEST)
        m_ref[...] = m_new

    @pl.when(step == pl.num_programs(1) - 1)
    def _():
        o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("block_kv", "sm_scale"))
def mla_decode(q_latent, q_rope, cache_latent, cache_rope, lengths, *, block_kv: int = 64,
               sm_scale: float = 1.0):
    batch, heads, c = q_latent.shape
    r = q_rope.shape[-1]
    seq = cache_latent.shape[1]
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(batch, seq // block_kv),
        in_specs=[pl.BlockSpec((None, heads, c), lambda b, s, lens: (b, 0, 0)),
                  pl.BlockSpec((None, heads, r), lambda b, s, lens: (b, 0, 0)),
                  pl.BlockSpec((None, block_kv, c), lambda b, s, lens: (b, s, 0)),
                  pl.BlockSpec((None, block_kv, r), lambda b, s, lens: (b, s, 0))],
        out_specs=pl.BlockSpec((None, heads, c), lambda b, s, lens: (b, 0, 0)),
        scratch_shapes=[pltpu.VMEM((heads, 1), jnp.float32),
                        pltpu.VMEM((heads, 1), jnp.float32),
                        pltpu.VMEM((heads, c), jnp.float32)])
    return pl.pallas_call(
        functools.partial(_kernel, block_kv=block_kv, sm_scale=sm_scale),
        grid_spec=grid_spec, out_shape=jax.ShapeDtypeStruct(q_latent.shape, q_latent.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")))(
        lengths, q_latent, q_rope, cache_latent, cache_rope)
