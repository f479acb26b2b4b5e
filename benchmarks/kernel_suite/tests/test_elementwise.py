import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpu_kernels import elementwise, runtime

pytestmark = pytest.mark.skipif(not runtime.can_run(), reason="needs a TPU")


@pytest.mark.parametrize("rows,width", [(64, 128), (256, 256)])
def test_add(rows, width):
    key = jax.random.key(rows)
    x, y = jax.random.normal(key, (2, rows, width), jnp.float32)
    np.testing.assert_allclose(elementwise.add(x, y), x + y, rtol=1e-6)
    np.testing.assert_allclose(elementwise.add(y, x, block_rows=16), y + x, rtol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_scaled_gelu(dtype):
    x = jax.random.normal(jax.random.key(1), (64, 256), jnp.float32).astype(dtype)
    for scale in (1.0, 0.5):
        want = scale * jax.nn.gelu(x.astype(jnp.float32), approximate=True)
        got = elementwise.scaled_gelu(x, scale=scale)
        tol = 1e-5 if dtype == jnp.float32 else 2e-2
        np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=tol, atol=tol)


def test_swiglu():
    gate, up = jax.random.normal(jax.random.key(2), (2, 128, 256), jnp.float32)
    np.testing.assert_allclose(elementwise.swiglu(gate, up), jax.nn.silu(gate) * up,
                               rtol=1e-5, atol=1e-6)


def test_clamp_bounds_are_runtime_values():
    x = jax.random.normal(jax.random.key(3), (32, 128), jnp.float32) * 3
    for low, high in ((-1.0, 1.0), (-0.5, 2.0)):
        got = elementwise.clamp(x, jnp.float32(low), jnp.float32(high))
        np.testing.assert_array_equal(got, jnp.clip(x, low, high))
