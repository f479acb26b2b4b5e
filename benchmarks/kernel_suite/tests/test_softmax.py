import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpu_kernels import runtime, softmax

pytestmark = pytest.mark.skipif(not runtime.can_run(), reason="needs a TPU")


@pytest.mark.parametrize("shape,block_rows", [((64, 128), 8), ((128, 512), 32)])
def test_softmax(shape, block_rows):
    x = jax.random.normal(jax.random.key(0), shape, jnp.float32) * 4
    got = softmax.softmax(x, block_rows=block_rows)
    np.testing.assert_allclose(got, jax.nn.softmax(x, axis=-1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(jnp.sum(got, axis=-1), np.ones(shape[0]), rtol=1e-5)


def test_softmax_bf16():
    x = jax.random.normal(jax.random.key(1), (32, 256), jnp.float32).astype(jnp.bfloat16)
    want = jax.nn.softmax(x.astype(jnp.float32), axis=-1)
    np.testing.assert_allclose(np.asarray(softmax.softmax(x), np.float32), want,
                               rtol=2e-2, atol=2e-3)


@pytest.mark.parametrize("lengths", [(128, 7, 64, 1), (1, 2, 3, 128)])
def test_masked_softmax(lengths):
    x = jax.random.normal(jax.random.key(2), (4, 8, 128), jnp.float32)
    lengths = jnp.asarray(lengths, jnp.int32)
    got = softmax.masked_softmax(x, lengths)
    valid = jnp.arange(128)[None, None, :] < lengths[:, None, None]
    want = jax.nn.softmax(jnp.where(valid, x, -jnp.inf), axis=-1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
