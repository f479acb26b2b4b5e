import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpu_kernels import layernorm, runtime

pytestmark = pytest.mark.skipif(not runtime.can_run(), reason="needs a TPU")


def _reference_layernorm(x, gamma, beta, eps=1e-5):
    x = x.astype(jnp.float32)
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + eps) * gamma + beta


@pytest.mark.parametrize("rows,width,dtype", [(64, 128, jnp.float32), (128, 256, jnp.float32),
                                              (64, 512, jnp.bfloat16)])
def test_layernorm(rows, width, dtype):
    keys = jax.random.split(jax.random.key(rows + width), 3)
    x = (jax.random.normal(keys[0], (rows, width)) * 3 + 1).astype(dtype)
    gamma = jax.random.normal(keys[1], (width,))
    beta = jax.random.normal(keys[2], (width,))
    tol = 1e-4 if dtype == jnp.float32 else 3e-2
    got = layernorm.layernorm(x, gamma, beta)
    np.testing.assert_allclose(np.asarray(got, np.float32), _reference_layernorm(x, gamma, beta),
                               rtol=tol, atol=tol)


def test_rmsnorm():
    x = jax.random.normal(jax.random.key(5), (64, 256), jnp.float32)
    gamma = jnp.linspace(0.5, 1.5, 256)
    want = x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * gamma
    for block_rows in (16, 32):
        np.testing.assert_allclose(layernorm.rmsnorm(x, gamma, block_rows=block_rows), want,
                                   rtol=1e-5, atol=1e-5)
