"""JAX's shipped TPU kernels, called as a repository that vendors them does: flash
attention, paged attention and megablox's grouped matmuls, with this repository's block
sizes."""

from __future__ import annotations

import functools
import importlib

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import flash_attention as _flash
from jax.experimental.pallas.ops.tpu import paged_attention as _paged

# `megablox.gmm` the package exports is the custom_vjp; the module holds gmm and tgmm.
_megablox = importlib.import_module("jax.experimental.pallas.ops.tpu.megablox.gmm")

SegmentIds = _flash.SegmentIds


def flash_attention(q, k, v, *, causal: bool, sm_scale: float = 1.0, segment_ids=None,
                    block: int = 128):
    sizes = _flash.BlockSizes(block_q=block, block_k_major=block, block_k=block, block_b=1)
    return _flash.flash_attention(q, k, v, segment_ids=segment_ids, causal=causal,
                                  sm_scale=sm_scale, block_sizes=sizes)


def paged_attention(q, k_pages, v_pages, lengths, page_indices, *, pages_per_block: int = 2,
                    inline_seq_dim: bool = True):
    return _paged.paged_attention(q, k_pages, v_pages, lengths, page_indices,
                                  pages_per_compute_block=pages_per_block,
                                  inline_seq_dim=inline_seq_dim)


@functools.partial(jax.jit, static_argnames="tiling")
def gmm(lhs, rhs, group_sizes, tiling=(64, 128, 128)):
    return _megablox.gmm(lhs, rhs, group_sizes, jnp.float32, tiling)


@functools.partial(jax.jit, static_argnames=("num_groups", "tiling"))
def tgmm(lhs, grad, group_sizes, num_groups: int, tiling=(64, 128, 128)):
    return _megablox.tgmm(lhs.T, grad, group_sizes, jnp.float32, tiling,
                          num_actual_groups=num_groups)
