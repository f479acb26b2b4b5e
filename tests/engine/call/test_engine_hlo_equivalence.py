"""Differential tests: seeded random BlockSpec pipelines, run by pallas-check and by JAX's
HLO interpreter (the same pallas_call with interpret=True, without our interception).

Each seed picks a dtype, array rank, block shape (ints, pl.Blocked, squeezed dims), array
sizes that leave edge blocks, and a permutation of grid axes in the index maps. Outputs
must agree element for element, with no findings.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

F32, BF16, I32 = jnp.float32, jnp.bfloat16, jnp.int32


def _assert_same(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype
    if got.dtype.kind in "iu":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32),
                                   rtol=1e-6, atol=0)


def _checked_and_oracle(check, fn, *args):
    r = check(fn, *args)
    assert r.session.engine_error is None, r.session.engine_error
    assert r.findings == [], [f.message for f in r.findings]
    assert len(r.session.calls) == 1
    want = jax.block_until_ready(fn(*args, interpret=True))
    for g, w in zip(jax.tree.leaves(r.value), jax.tree.leaves(want)):
        _assert_same(g, w)
    return r.value


def _random_pipeline(seed):
    rng = np.random.default_rng(seed)
    dtype = [F32, BF16, I32][seed % 3]
    ndim = int(rng.integers(2, 4))
    block, shape = [], []
    for d in range(ndim):
        if d == ndim - 1:
            b = int(rng.choice([128, 256]))
        elif d == ndim - 2:
            b = int(rng.choice([8, 16]))
        else:
            b = None if rng.random() < 0.5 else int(rng.integers(1, 3))
        size = 1 if b is None else b
        n = size * int(rng.integers(1, 4))
        if b is not None and d >= ndim - 2 and rng.random() < 0.6:
            n += int(rng.integers(1, size))  # an edge block
        shape.append(n)
        spec = b
        if b is not None and rng.random() < 0.3:
            spec = pl.Blocked(b)
        elif b is None and rng.random() < 0.5:
            spec = pl.Squeezed()
        block.append(spec)
    sizes = [1 if b is None or isinstance(b, pl.Squeezed) else getattr(b, "block_size", b)
             for b in block]
    nblocks = [-(-n // s) for n, s in zip(shape, sizes)]
    perm = [int(p) for p in rng.permutation(ndim)]  # dim d is driven by grid axis perm[d]
    grid = [0] * ndim
    for d in range(ndim):
        grid[perm[d]] = nblocks[d]
    return dtype, tuple(shape), tuple(block), tuple(grid), perm


@pytest.mark.parametrize("seed", range(9))
def test_random_pipeline_matches_hlo_interpreter(check, seed):
    dtype, shape, block, grid, perm = _random_pipeline(seed)
    rng = np.random.default_rng(100 + seed)
    x = jnp.asarray(rng.integers(-50, 50, shape), dtype)
    y = jnp.asarray(rng.integers(-50, 50, shape), dtype)

    def imap(*g):
        return tuple(g[perm[d]] for d in range(len(perm)))

    def fn(x, y, interpret=False):
        def kernel(x_ref, y_ref, o_ref):
            pid = 0
            for a in range(len(grid)):
                pid = pid * 7 + pl.program_id(a)
            o_ref[...] = x_ref[...] * 3 - y_ref[...] + pid.astype(o_ref.dtype)

        spec = pl.BlockSpec(block, imap)
        return pl.pallas_call(kernel, grid=grid, in_specs=[spec, spec], out_specs=spec,
                              out_shape=jax.ShapeDtypeStruct(shape, dtype),
                              interpret=interpret)(x, y)

    _checked_and_oracle(check, fn, x, y)


@pytest.mark.parametrize("seed", range(3))
def test_random_transpose_reduce_matches_hlo_interpreter(check, seed):
    """Blocks read at (i, k) and written transposed at (j, i), a row sum accumulated over
    the 'arbitrary' axis k, with array sizes that leave edge blocks in the copied dims."""
    rng = np.random.default_rng(200 + seed)
    bm, bk = int(rng.choice([128, 256])), 128
    m = bm * int(rng.integers(1, 3)) + int(rng.integers(0, bm)) * (seed % 2)
    nk = int(rng.integers(1, 4))
    x = jnp.asarray(rng.standard_normal((m, bk * nk)), F32)

    def fn(x, interpret=False):
        def kernel(x_ref, t_ref, s_ref):
            k = pl.program_id(1)

            @pl.when(k == 0)
            def _():
                s_ref[...] = jnp.zeros_like(s_ref)

            t_ref[...] = x_ref[...].T
            s_ref[...] += jnp.sum(x_ref[...], axis=1, keepdims=True)

        return pl.pallas_call(
            kernel, grid=(pl.cdiv(m, bm), nk),
            in_specs=[pl.BlockSpec((bm, bk), lambda i, k: (i, k))],
            out_specs=[pl.BlockSpec((bk, bm), lambda i, k: (k, i)),
                       pl.BlockSpec((bm, 1), lambda i, k: (i, 0))],
            out_shape=[jax.ShapeDtypeStruct((bk * nk, m), F32),
                       jax.ShapeDtypeStruct((m, 1), F32)],
            compiler_params=pltpu.CompilerParams(
                dimension_semantics=("parallel", "arbitrary")),
            interpret=interpret)(x)

    t, s = _checked_and_oracle(check, fn, x)
    np.testing.assert_array_equal(t, np.asarray(x).T)
    np.testing.assert_allclose(s[:, 0], np.asarray(x).sum(1), rtol=1e-5, atol=1e-4)
