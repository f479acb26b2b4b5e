import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpu_kernels import runtime, transpose

pytestmark = pytest.mark.skipif(not runtime.can_run(), reason="needs a TPU")


@pytest.mark.parametrize("shape", [(128, 256), (256, 384)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_transpose(shape, dtype):
    x = jax.random.normal(jax.random.key(0), shape, jnp.float32).astype(dtype)
    np.testing.assert_array_equal(transpose.transpose(x), x.T)


@pytest.mark.parametrize("b,h,s,d", [(1, 4, 128, 128), (2, 2, 128, 64)])
def test_heads_to_seq_major(b, h, s, d):
    x = jax.random.normal(jax.random.key(1), (b, h, s, d), jnp.float32)
    np.testing.assert_array_equal(transpose.heads_to_seq_major(x), x.transpose(0, 2, 1, 3))
