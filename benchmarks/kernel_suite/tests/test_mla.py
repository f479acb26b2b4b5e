import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpu_kernels import mla, runtime

pytestmark = pytest.mark.skipif(not runtime.can_run(), reason="needs a TPU")
HIGHEST = jax.lax.Precision.HIGHEST


def _reference(q_latent, q_rope, c, k_rope, lengths, sm_scale):
    s = (jnp.einsum("bhc,bsc->bhs", q_latent, c, precision=HIGHEST)
         + jnp.einsum("bhr,bsr->bhs", q_rope, k_rope, precision=HIGHEST)) * sm_scale
    valid = jnp.arange(c.shape[1])[None, None, :] < lengths[:, None, None]
    p = jax.nn.softmax(jnp.where(valid, s, -jnp.inf), -1)
    return jnp.einsum("bhs,bsc->bhc", p, c, precision=HIGHEST)


@pytest.mark.parametrize("heads,latent,rope_dim", [(8, 128, 64), (16, 256, 64)])
def test_mla_decode(heads, latent, rope_dim):
    batch, seq = 2, 128
    keys = jax.random.split(jax.random.key(heads), 4)
    q_latent = jax.random.normal(keys[0], (batch, heads, latent))
    q_rope = jax.random.normal(keys[1], (batch, heads, rope_dim))
    c = jax.random.normal(keys[2], (batch, seq, latent))
    k_rope = jax.random.normal(keys[3], (batch, seq, rope_dim))
    scale = (latent + rope_dim) ** -0.5
    for lengths in ([128, 128], [3, 100]):
        lengths = jnp.asarray(lengths, jnp.int32)
        got = mla.mla_decode(q_latent, q_rope, c, k_rope, lengths, sm_scale=scale)
        np.testing.assert_allclose(got, _reference(q_latent, q_rope, c, k_rope, lengths, scale),
                                   rtol=1e-4, atol=1e-4)
