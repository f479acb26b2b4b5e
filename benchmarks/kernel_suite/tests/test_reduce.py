import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpu_kernels import reduce, runtime

pytestmark = pytest.mark.skipif(not runtime.can_run(), reason="needs a TPU")


@pytest.mark.parametrize("shape", [(64, 128), (128, 256)])
def test_column_sum(shape):
    x = jax.random.normal(jax.random.key(0), shape, jnp.float32)
    np.testing.assert_allclose(reduce.column_sum(x), x.sum(0), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(reduce.column_sum(x, block_rows=32), x.sum(0), rtol=1e-5,
                               atol=1e-4)


def test_row_max():
    x = jax.random.normal(jax.random.key(1), (64, 256), jnp.float32)
    np.testing.assert_array_equal(reduce.row_max(x), x.max(-1))
    np.testing.assert_array_equal(reduce.row_max(-x), (-x).max(-1))


def test_sum_of_squares():
    x = jax.random.normal(jax.random.key(2), (128, 128), jnp.float32)
    np.testing.assert_allclose(reduce.sum_of_squares(x), jnp.sum(x * x), rtol=1e-5)
