import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpu_kernels import kv_cache_update, runtime

pytestmark = pytest.mark.skipif(not runtime.can_run(), reason="needs a TPU")


@pytest.mark.parametrize("tokens", [1, 8])
def test_write_tokens(tokens):
    cache = jax.random.normal(jax.random.key(0), (256, 128), jnp.float32)
    expected = np.array(cache)
    for step in range(2):
        slots = jax.random.permutation(jax.random.key(step), 256)[:tokens].astype(jnp.int32)
        new = jax.random.normal(jax.random.key(10 + step), (tokens, 128), jnp.float32)
        expected[np.asarray(slots)] = np.asarray(new)
        cache = kv_cache_update.write_tokens(cache, new, slots)
        np.testing.assert_array_equal(cache, expected)


def test_write_pages():
    cache = jnp.zeros((16, 16, 128), jnp.bfloat16)
    expected = np.zeros((16, 16, 128), np.float32)
    for pages in ([3, 0, 9], [15, 4, 3, 7]):
        pages = jnp.asarray(pages, jnp.int32)
        new = jax.random.normal(jax.random.key(len(pages)), (len(pages), 16, 128))
        new = new.astype(jnp.bfloat16)
        expected[np.asarray(pages)] = np.asarray(new, np.float32)
        cache = kv_cache_update.write_pages(cache, new, pages)
        np.testing.assert_array_equal(np.asarray(cache, np.float32), expected)
