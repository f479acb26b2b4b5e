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
