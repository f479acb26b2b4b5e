import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpu_kernels import runtime, sparse

pytestmark = pytest.mark.skipif(not runtime.can_run(), reason="needs a TPU")
HIGHEST = jax.lax.Precision.HIGHEST


def _masked(x, mask, bm, bk):
    full = np.kron(np.asarray(mask), np.ones((bm, bk)))
    return x * full


@pytest.mark.parametrize("pattern", ["diagonal", "lower", "random"])
def test_block_sparse_matmul(pattern):
    bm, bk, m, k, n = 64, 128, 256, 512, 128
    rows, steps = m // bm, k // bk
    if pattern == "diagonal":
        mask = np.eye(rows, steps, dtype=np.int32)
    elif pattern == "lower":
        mask = np.tril(np.ones((rows, steps), np.int32))
    else:
        mask = (np.random.default_rng(0).random((rows, steps)) < 0.4).astype(np.int32)
        mask[:, 0] = 1
    live, fetch = sparse.block_tables(mask)
    keys = jax.random.split(jax.random.key(len(pattern)), 2)
    x = _masked(jax.random.normal(keys[0], (m, k), jnp.float32), mask, bm, bk)
    w = jax.random.normal(keys[1], (k, n), jnp.float32)
    got = sparse.block_sparse_matmul(x, w, jnp.asarray(live), jnp.asarray(fetch),
                                     bm=bm, bk=bk, precision=HIGHEST)
    np.testing.assert_allclose(got, jnp.dot(x, w, precision=HIGHEST), rtol=1e-5, atol=1e-4)


def test_block_tables_point_masked_steps_at_the_last_live_block():
    live, fetch = sparse.block_tables(np.array([[1, 0, 0, 1], [0, 1, 0, 0]]))
    np.testing.assert_array_equal(fetch, [[0, 0, 0, 3], [0, 1, 1, 1]])
