"""A kernel checked three ways: against a jax.numpy reference, against JAX's own HLO
interpreter (the same pallas_call with interpret=True, run without our interception),
and for zero findings. The engine feature tests (tests/engine/*/test_*_features.py,
test_control_flow.py, test_ref_indexing.py, tests/intercept/test_jax_transforms.py) use
it on kernels that are all correct."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

F32, BF16, I32 = jnp.float32, jnp.bfloat16, jnp.int32
# pltpu.semaphore_* are deprecated aliases of these in this JAX.
signal, wait, read = pl.semaphore_signal, pl.semaphore_wait, pl.semaphore_read


def _assert_close(got, want, dtype=None, rtol=1e-6):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    if got.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want)
    else:
        if got.dtype == jnp.bfloat16 or dtype == BF16:
            rtol = max(rtol, 1e-2)
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32),
                                   rtol=rtol, atol=rtol)


def _compare(got, want, rtol):
    got, want = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        _assert_close(g, w, rtol=rtol)


def run_checked(check, fn, *args, config=None, reference=None, oracle=True, rtol=1e-6,
                calls=None):
    """Run fn(*args) under pallas-check; assert no findings, the reference, the oracle."""
    r = check(fn, *args, config=config)
    assert r.session.engine_error is None, r.session.engine_error
    assert r.findings == [], [f.message for f in r.findings]
    assert r.session.calls, "the pallas_call was not intercepted"
    if calls is not None:
        assert len(r.session.calls) == calls
    if reference is not None:
        _compare(r.value, reference, rtol)
    if oracle:
        want = jax.block_until_ready(fn(*args, interpret=True))
        _compare(r.value, want, rtol)
    return r.value


def arange(shape, dtype=F32, mod=None):
    x = np.arange(int(np.prod(shape))).reshape(shape)
    if mod:
        x = x % mod
    return jnp.asarray(x, dtype=dtype)


def pids_offset(rank):
    """sum_a program_id(a) * 10**(rank-1-a) + 1000 * prod(num_programs)."""
    off = jnp.int32(0)
    n = jnp.int32(1)
    for a in range(rank):
        off = off + pl.program_id(a) * 10 ** (rank - 1 - a)
        n = n * pl.num_programs(a)
    return off + 1000 * n
