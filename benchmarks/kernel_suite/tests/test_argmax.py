import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpu_kernels import argmax, runtime

pytestmark = pytest.mark.skipif(not runtime.can_run(), reason="needs a TPU")


@pytest.mark.parametrize("shape", [(32, 128), (64, 512)])
def test_argmax(shape):
    x = jax.random.normal(jax.random.key(0), shape, jnp.float32)
    np.testing.assert_array_equal(argmax.argmax(x), jnp.argmax(x, axis=-1))
    ties = jnp.zeros(shape, jnp.float32).at[:, 5].set(1.0).at[:, 9].set(1.0)
    np.testing.assert_array_equal(argmax.argmax(ties), np.full(shape[0], 5))


@pytest.mark.parametrize("k", [2, 4])
def test_top_k(k):
    x = jax.random.normal(jax.random.key(k), (32, 256), jnp.float32)
    values, indices = argmax.top_k(x, k=k)
    want_values, want_indices = jax.lax.top_k(x, k)
    np.testing.assert_array_equal(values, want_values)
    np.testing.assert_array_equal(indices, want_indices)
