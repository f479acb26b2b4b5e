"""Grouped-query decode attention: one new token per sequence, its query heads grouped by
KV head, the KV cache read in blocks along the sequence with an online softmax; each
sequence's length is prefetched (blocks past it are skipped), with an optional logit
soft cap."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

NEG_INF = -1e30


def _kernel(lengths_ref, q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *,
            block_kv: int, sm_scale: float, soft_cap: float | None):
    b, kv_step = pl.program_id(0), pl.program_id(2)
    length = lengths_ref[b]

    @pl.when(kv_step == 0)
    def _():
        m_ref[...] = jnp.full_like(m_ref, NEG_INF)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(kv_step * block_kv < length)
    def _():
        q = q_ref[...].astype(jnp.float32)
        k = k_ref[...].astype(jnp.float32)
        s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())),
                                precision=jax.lax.Precision.HIGHEST) * sm_scale
        if soft_cap is not None:
            s = soft_cap * jnp.tanh(s / soft_cap)
        position = kv_step * block_kv + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
        s = jnp.where(position < length, s, NEG_INF)
        m_prev = m_ref[...]
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
        p = jnp.exp(s - m_new)
        alpha = jnp.exp(m_prev - m_new)
        l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=-1, keepdims=True)
        acc_ref[...] = alpha * acc_ref[...] + jnp.dot(
            p, v_ref[...].astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
        m_ref[...] = m_new

    @pl.when(kv_step == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("block_kv", "sm_scale", "soft_cap"))
def decode_attention(q, k, v, lengths, *, block_kv: int = 128, sm_scale: float = 1.0,
                     soft_cap: float | None = None):
    """q (B, Hq, D); k, v (B, Hkv, S, D); lengths (B,) -> (B, Hq, D)."""
    batch, q_heads, d = q.shape
    _, kv_heads, seq, _ = k.shape
    group = q_heads // kv_heads
    q4 = q.reshape(batch, kv_heads, group, d)
    kv_spec = pl.BlockSpec((None, None, block_kv, d), lambda b, h, s, lens: (b, h, s, 0))
    q_spec = pl.BlockSpec((None, None, group, d), lambda b, h, s, lens: (b, h, 0, 0))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(batch, kv_heads, seq // block_kv),
        in_specs=[q_spec, kv_spec, kv_spec], out_specs=q_spec,
        scratch_shapes=[pltpu.VMEM((group, 1), jnp.float32),
                        pltpu.VMEM((group, 1), jnp.float32),
                        pltpu.VMEM((group, d), jnp.float32)])
    kernel = functools.partial(_kernel, block_kv=block_kv, sm_scale=sm_scale,
                               soft_cap=soft_cap)
    out = pl.pallas_call(
        kernel, grid_spec=grid_spec, out_shape=jax.ShapeDtypeStruct(q4.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")))(lengths, q4, k, v)
    return out.reshape(batch, q_heads, d)
