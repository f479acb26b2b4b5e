"""Ragged paged attention (multi-query: the query heads share one KV head).

A batch mixes decode tokens and prefill chunks: sequence s has q_lens[s] new tokens and
kv_lens[s] tokens in its pages (the new ones included), its pages listed in a page table.
The packed queries (heads, tokens, dim) give each sequence a region padded to a multiple
of the query block; a work list (one entry per query block: its sequence and its first
row within the sequence) drives the grid's first axis, pages its second. Every table is a
scalar-prefetch operand; pages past a sequence's length are neither fetched (the index
map repeats the last live page) nor computed. Causal within the sequence."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

NEG_INF = -1e30
HIGHEST = jax.lax.Precision.HIGHEST


def work_list(q_lens: list[int], block_q: int) -> tuple[np.ndarray, ...]:
    """(sequence, query block, first row in the sequence) of every query block, and each
    sequence's first padded token."""
    seqs, blocks, offsets, starts = [], [], [], []
    start = 0
    for s, q_len in enumerate(q_lens):
        starts.append(start)
        for offset in range(0, q_len, block_q):
            seqs.append(s)
            blocks.append((start + offset) // block_q)
            offsets.append(offset)
        start += -(-q_len // block_q) * block_q
    as_int = lambda xs: np.asarray(xs, np.int32)
    return as_int(seqs), as_int(blocks), as_int(offsets), as_int(starts)


def _kernel(seq_ref, blk_ref, off_ref, kv_len_ref, q_len_ref, table_ref,
            q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *,
            page: int, heads: int, sm_scale: float):
    del blk_ref, table_ref  # read by the index maps
    w, j = pl.program_id(0), pl.program_id(1)
    seq = seq_ref[w]
    kv_len, q_len, offset = kv_len_ref[seq], q_len_ref[seq], off_ref[w]

    @pl.when(j == 0)
    def _():
        m_ref[...] = jnp.full_like(m_ref, NEG_INF)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(j * page < kv_len)
    def _():
        block_q = q_ref.shape[1]
        row = jax.lax.broadcasted_iota(jnp.int32, (block_q, page), 0)
        col = jax.lax.broadcasted_iota(jnp.int32, (block_q, page), 1)
        q_pos = kv_len - q_len + jnp.minimum(offset + row, q_len - 1)
        k_pos = j * page + col
        allowed = jnp.logical_and(k_pos <= q_pos, k_pos < kv_len)
        k = k_ref[...].astype(jnp.float32)
        v = v_ref[...].astype(jnp.float32)
        for h in range(heads):
            s = jax.lax.dot_general(q_ref[h].astype(jnp.float32), k,
                                    (((1,), (1,)), ((), ())), precision=HIGHEST) * sm_scale
            s = jnp.where(allowed, s, NEG_INF)
            m_prev = m_ref[h]
            m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
            p = jnp.exp(s - m_new)
            alpha = jnp.exp(m_prev - m_new)
            l_ref[h] = alpha * l_ref[h] + jnp.sum(p, axis=-1, keepdims=True)
            acc_ref[h] = alpha * acc_ref[h] + jnp.dot(p, v, precision=HIGHEST)
            m_ref[h] = m_new

    @pl.when(j == pl.num_programs(1) - 1)
    def _():
        o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("block_q", "sm_scale"))
def ragged_paged_attention(q, k_pages, v_pages, kv_lens, q_lens, page_table, seqs, blocks,
                           offsets, *, block_q: int = 8, sm_scale: float = 1.0):
    """q (H, T_padded, D); k_pages, v_pages (P, page, D); kv_lens, q_lens (S,);
    page_table (S, max_pages); seqs, blocks, offsets: `work_list`'s."""
    heads, tokens, d = q.shape
    page = k_pages.shape[1]
    max_pages = page_table.shape[1]

    def page_map(w, j, seq_ref, blk_ref, off_ref, kv_len_ref, q_len_ref, table_ref):
        seq = seq_ref[w]
        last = (kv_len_ref[seq] - 1) // page
        return table_ref[seq, jnp.minimum(j, last)], 0, 0

    def q_map(w, j, seq_ref, blk_ref, *_):
        return 0, blk_ref[w], 0

    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=6, grid=(seqs.shape[0], max_pages),
        in_specs=[pl.BlockSpec((heads, block_q, d), q_map),
                  pl.BlockSpec((None, page, d), page_map),
                  pl.BlockSpec((None, page, d), page_map)],
        out_specs=pl.BlockSpec((heads, block_q, d), q_map),
        scratch_shapes=[pltpu.VMEM((heads, block_q, 1), jnp.float32),
                        pltpu.VMEM((heads, block_q, 1), jnp.float32),
                        pltpu.VMEM((heads, block_q, d), jnp.float32)])
    kernel = functools.partial(_kernel, page=page, heads=heads, sm_scale=sm_scale)
    return pl.pallas_call(
        kernel, grid_spec=grid_spec, out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")))(
        seqs, blocks, offsets, kv_lens, q_lens, page_table, q, k_pages, v_pages)
