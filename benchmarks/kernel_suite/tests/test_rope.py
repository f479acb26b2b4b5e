import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpu_kernels import rope, runtime

pytestmark = pytest.mark.skipif(not runtime.can_run(), reason="needs a TPU")


def _reference(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


@pytest.mark.parametrize("heads,seq,dim", [(2, 128, 128), (4, 256, 128)])
def test_rope(heads, seq, dim):
    cos, sin = rope.tables(512, dim)
    x = jax.random.normal(jax.random.key(seq), (heads, seq, dim), jnp.float32)
    got = rope.apply_rope(x, cos, sin)
    np.testing.assert_allclose(got, _reference(x, cos[:seq], sin[:seq]), rtol=1e-5, atol=1e-5)
    # Rotations keep norms.
    np.testing.assert_allclose(jnp.linalg.norm(got, axis=-1), jnp.linalg.norm(x, axis=-1),
                               rtol=1e-5)


def test_rope_decode_positions():
    cos, sin = rope.tables(512, 128)
    x = jax.random.normal(jax.random.key(3), (4, 8, 128), jnp.float32)
    for positions in ([0, 17, 300, 511], [5, 5, 5, 5]):
        positions = jnp.asarray(positions, jnp.int32)
        got = rope.apply_rope_decode(x, cos, sin, positions)
        want = _reference(x, cos[positions][:, None, :], sin[positions][:, None, :])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
