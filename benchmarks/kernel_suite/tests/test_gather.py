import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpu_kernels import gather, runtime

pytestmark = pytest.mark.skipif(not runtime.can_run(), reason="needs a TPU")


@pytest.mark.parametrize("n,m", [(16, 8), (64, 24)])
def test_gather_tiles(n, m):
    table = jax.random.normal(jax.random.key(n), (n, 8, 128), jnp.float32)
    for seed in (0, 1):
        indices = jax.random.randint(jax.random.key(seed), (m,), 0, n, jnp.int32)
        np.testing.assert_array_equal(gather.gather_tiles(table, indices), table[indices])


@pytest.mark.parametrize("rows", [8, 16])
def test_embedding_lookup(rows):
    table = jax.random.normal(jax.random.key(2), (512, 128), jnp.float32)
    ids = jax.random.randint(jax.random.key(3), (32,), 0, 512, jnp.int32)
    np.testing.assert_array_equal(gather.embedding_lookup(table, ids, rows=rows), table[ids])
    np.testing.assert_allclose(gather.embedding_lookup(table, ids, rows=rows, scale=2.0),
                               2.0 * table[ids], rtol=1e-6)
