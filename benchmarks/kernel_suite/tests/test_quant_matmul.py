import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpu_kernels import quant_matmul, runtime

pytestmark = pytest.mark.skipif(not runtime.can_run(), reason="needs a TPU")
HIGHEST = jax.lax.Precision.HIGHEST


@pytest.mark.parametrize("m,k,n", [(64, 256, 128), (128, 128, 256)])
def test_weight_only_int8(m, k, n):
    keys = jax.random.split(jax.random.key(m + k + n), 2)
    x = jax.random.normal(keys[0], (m, k), jnp.float32)
    w_int8, scales = quant_matmul.quantize_columns(jax.random.normal(keys[1], (k, n)))
    got = quant_matmul.weight_only_matmul(x, w_int8, scales, precision=HIGHEST)
    want = jnp.dot(x, w_int8.astype(jnp.float32), precision=HIGHEST) * scales
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_weight_only_int8_bf16_activations():
    keys = jax.random.split(jax.random.key(7), 2)
    x = jax.random.normal(keys[0], (64, 128), jnp.float32).astype(jnp.bfloat16)
    w_int8, scales = quant_matmul.quantize_columns(jax.random.normal(keys[1], (128, 128)))
    want = jnp.dot(x.astype(jnp.float32), w_int8.astype(jnp.float32), precision=HIGHEST) * scales
    got = quant_matmul.weight_only_matmul(x, w_int8, scales)
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=2e-2, atol=5e-2)


def test_w8a8_is_exact_in_int32():
    keys = jax.random.split(jax.random.key(8), 2)
    x_int8, x_scales = quant_matmul.quantize_rows(jax.random.normal(keys[0], (64, 256)))
    w_int8, w_scales = quant_matmul.quantize_columns(jax.random.normal(keys[1], (256, 128)))
    got = quant_matmul.w8a8_matmul(x_int8, w_int8, x_scales, w_scales)
    exact = np.asarray(x_int8, np.int64) @ np.asarray(w_int8, np.int64)
    want = exact.astype(np.float32) * np.asarray(x_scales)[:, None] * np.asarray(w_scales)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
