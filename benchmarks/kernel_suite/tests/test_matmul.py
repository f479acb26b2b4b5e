import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpu_kernels import matmul, runtime

pytestmark = pytest.mark.skipif(not runtime.can_run(), reason="needs a TPU")
HIGHEST = jax.lax.Precision.HIGHEST


@pytest.mark.parametrize("m,n,k", [(128, 128, 256), (256, 128, 128)])
def test_matmul_f32_highest(m, n, k):
    keys = jax.random.split(jax.random.key(m + n + k), 2)
    x = jax.random.normal(keys[0], (m, k), jnp.float32)
    y = jax.random.normal(keys[1], (k, n), jnp.float32)
    got = matmul.matmul(x, y, precision=HIGHEST)
    np.testing.assert_allclose(got, jnp.dot(x, y, precision=HIGHEST), rtol=1e-5, atol=1e-4)


def test_matmul_bf16():
    keys = jax.random.split(jax.random.key(3), 2)
    x = jax.random.normal(keys[0], (128, 256), jnp.float32).astype(jnp.bfloat16)
    y = jax.random.normal(keys[1], (256, 128), jnp.float32).astype(jnp.bfloat16)
    want = jnp.dot(x.astype(jnp.float32), y.astype(jnp.float32), precision=HIGHEST)
    np.testing.assert_allclose(np.asarray(matmul.matmul(x, y), np.float32), want,
                               rtol=2e-2, atol=1e-1)


def test_matmul_bias_relu():
    keys = jax.random.split(jax.random.key(4), 3)
    x = jax.random.normal(keys[0], (128, 128), jnp.float32)
    y = jax.random.normal(keys[1], (128, 256), jnp.float32)
    bias = jax.random.normal(keys[2], (256,), jnp.float32)
    got = matmul.matmul(x, y, bias, precision=HIGHEST, activation="relu")
    want = jnp.maximum(jnp.dot(x, y, precision=HIGHEST) + bias, 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
