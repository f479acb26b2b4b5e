"""The kernel library's tests, as a TPU-only repository writes them: skipped wherever no
TPU device is found, no conftest, results checked against numpy. Not collected by
pallas-check's own test run (the name is no test_*.py); tests/api/test_tpu_suite.py runs it
under `pytest --pallas-check --pallas-check-tpu v6e`, where every test must run and pass."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels

pytestmark = pytest.mark.skipif(
    not any("TPU" in d.device_kind for d in jax.devices()), reason="needs a TPU")

X = np.arange(64 * 256, dtype=np.float32).reshape(64, 256) / 7.0


def test_scale_rows():
    np.testing.assert_allclose(np.asarray(kernels.scale_rows(jnp.asarray(X), 3.0)), X * 3.0,
                               rtol=1e-6)


def test_scale_rows_jitted():
    fn = jax.jit(kernels.scale_rows, static_argnums=1)
    np.testing.assert_allclose(np.asarray(fn(jnp.asarray(X[:32]), 0.5)), X[:32] * 0.5,
                               rtol=1e-6)


def test_gpu_params_are_refused():
    """A TPU refuses Triton's compiler params as the call is made."""
    with pytest.raises(AssertionError):
        kernels.scale_rows_gpu_params(jnp.asarray(X[:32]), 2.0)


def test_double_per_core():
    np.testing.assert_array_equal(np.asarray(kernels.double_per_core(jnp.asarray(X[:16]))),
                                  X[:16] * 2)


def test_add_tiled():
    y = np.flip(X, axis=0).copy()
    np.testing.assert_allclose(np.asarray(kernels.add_tiled(jnp.asarray(X), jnp.asarray(y))),
                               X + y, rtol=1e-6)


def test_scale_tokens_drops_the_padding():
    out = kernels.scale_tokens(jnp.asarray(X), 20, 2.0)
    np.testing.assert_allclose(np.asarray(out), X[:20] * 2.0, rtol=1e-6)


RNG = np.random.default_rng(0)
A = RNG.standard_normal((128, 256)).astype(np.float32)
B = RNG.standard_normal((256, 128)).astype(np.float32)


def test_matmul_matches_the_programs_own_product():
    """At the default precision a TPU rounds the operands of a float32 product to bfloat16,
    in the kernel and in jnp.dot alike: the two agree."""
    np.testing.assert_allclose(np.asarray(kernels.matmul(jnp.asarray(A), jnp.asarray(B))),
                               np.asarray(jnp.dot(A, B)), rtol=1e-5, atol=1e-4)


def test_matmul_at_highest_matches_float64():
    np.testing.assert_allclose(
        np.asarray(kernels.matmul(jnp.asarray(A), jnp.asarray(B), "highest")),
        A.astype(np.float64) @ B.astype(np.float64), rtol=1e-5, atol=1e-4)


def test_matmul_at_default_precision_is_not_float32():
    """What a TPU does (measured on a v5e): the default-precision kernel is about 0.1 away
    from the exact product on these operands, far beyond float32's rounding."""
    out = np.asarray(kernels.matmul(jnp.asarray(A), jnp.asarray(B)))
    assert np.abs(out - A.astype(np.float64) @ B.astype(np.float64)).max() > 0.05


ROWS = kernels.MAX_SEQS * kernels.SEQ_ROWS
CACHE = np.arange(ROWS * 128, dtype=np.float32).reshape(ROWS, 128) / 9.0
NEW = np.repeat(-np.arange(1, kernels.MAX_SEQS + 1, dtype=np.float32)[:, None], 128, axis=1)
LENS = np.array([3, 0, 7, 15, 2, 0, 0, 0], np.int32)


def test_append_tokens_updates_the_donated_cache():
    """Four live sequences of eight: each appends its new row at its own length, the
    cache is updated in place (donated: the caller's array is consumed) and only the
    live sequences grow."""
    cache = jnp.asarray(CACHE)
    out, lens = kernels.append_tokens(cache, jnp.asarray(NEW), jnp.asarray(LENS),
                                      jnp.asarray([4], jnp.int32))
    want = CACHE.copy()
    for i in range(4):
        want[i * kernels.SEQ_ROWS + LENS[i]] = NEW[i]
    np.testing.assert_array_equal(np.asarray(out), want)
    np.testing.assert_array_equal(np.asarray(lens), LENS + [1, 1, 1, 1, 0, 0, 0, 0])
    assert cache.is_deleted()
