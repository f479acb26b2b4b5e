import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpu_kernels import pipeline, runtime

pytestmark = pytest.mark.skipif(not runtime.can_run(), reason="needs a TPU")
HIGHEST = jax.lax.Precision.HIGHEST


@pytest.mark.parametrize("rows", [64, 256])
def test_residual_update(rows):
    x, r = jax.random.normal(jax.random.key(rows), (2, rows, 256), jnp.float32)
    np.testing.assert_allclose(pipeline.residual_update(x, r), x * 0.5 + r, rtol=1e-6)
    np.testing.assert_allclose(pipeline.residual_update(x, r, gain=2.0, block_rows=16),
                               x * 2.0 + r, rtol=1e-6)


@pytest.mark.parametrize("m,k,n", [(128, 256, 256), (64, 128, 384)])
def test_slab_matmul(m, k, n):
    keys = jax.random.split(jax.random.key(m + n), 2)
    x = jax.random.normal(keys[0], (m, k), jnp.float32)
    w = jax.random.normal(keys[1], (k, n), jnp.float32)
    np.testing.assert_allclose(pipeline.slab_matmul(x, w), jnp.dot(x, w, precision=HIGHEST),
                               rtol=1e-5, atol=1e-4)
