"""Block-sparse matmul: y = (mask ⊙ x) @ w where a prefetched (M/bm, K/bk) block mask says
which blocks of x are non-zero. A masked-out step skips its compute, and its index maps
point at the last live block instead (no new DMA), as splash attention does."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def block_tables(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each (row block, k step): whether it is live, and the k block to fetch (the
    step's own when live, else the last live one before it; 0 before any)."""
    live = np.asarray(mask, dtype=np.int32)
    fetch = np.zeros_like(live)
    for i in range(live.shape[0]):
        last = 0
        for kk in range(live.shape[1]):
            if live[i, kk]:
                last = kk
            fetch[i, kk] = last
    return live, fetch


def _kernel(live_ref, fetch_ref, x_ref, w_ref, o_ref, acc_ref, *, precision):
    i, kk = pl.program_id(0), pl.program_id(2)

    @pl.when(kk == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(live_ref[i, kk] != 0)
    def _():
        acc_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32,
                                precision=precision)

    @pl.when(kk == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bm", "bn", "bk", "precision"))
def block_sparse_matmul(x, w, live, fetch, *, bm=64, bn=128, bk=128, precision=None):
    m, k = x.shape
    n = w.shape[1]
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2, grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk, live, fetch: (i, fetch[i, kk])),
                  pl.BlockSpec((bk, bn), lambda i, j, kk, live, fetch: (fetch[i, kk], j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk, live, fetch: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)])
    return pl.pallas_call(
        functools.partial(_kernel, precision=precision), grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")))(
        live, fetch, x, w)
