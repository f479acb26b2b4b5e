import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpu_kernels import decode_attention, runtime

pytestmark = pytest.mark.skipif(not runtime.can_run(), reason="needs a TPU")
HIGHEST = jax.lax.Precision.HIGHEST


def _reference(q, k, v, lengths, sm_scale, soft_cap):
    batch, q_heads, d = q.shape
    group = q_heads // k.shape[1]
    k, v = jnp.repeat(k, group, 1), jnp.repeat(v, group, 1)
    s = jnp.einsum("bhd,bhkd->bhk", q, k, precision=HIGHEST) * sm_scale
    if soft_cap is not None:
        s = soft_cap * jnp.tanh(s / soft_cap)
    valid = jnp.arange(k.shape[2])[None, None, :] < lengths[:, None, None]
    p = jax.nn.softmax(jnp.where(valid, s, -jnp.inf), -1)
    return jnp.einsum("bhk,bhkd->bhd", p, v, precision=HIGHEST)


@pytest.mark.parametrize("kv_heads,group", [(1, 8), (2, 4)])
@pytest.mark.parametrize("soft_cap", [None, 30.0])
def test_decode_attention(kv_heads, group, soft_cap):
    batch, seq, d = 2, 256, 128
    keys = jax.random.split(jax.random.key(kv_heads * group), 3)
    q = jax.random.normal(keys[0], (batch, kv_heads * group, d))
    k = jax.random.normal(keys[1], (batch, kv_heads, seq, d))
    v = jax.random.normal(keys[2], (batch, kv_heads, seq, d))
    for lengths in ([256, 256], [1, 130]):
        lengths = jnp.asarray(lengths, jnp.int32)
        got = decode_attention.decode_attention(q, k, v, lengths, sm_scale=d ** -0.5,
                                                soft_cap=soft_cap)
        want = _reference(q, k, v, lengths, d ** -0.5, soft_cap)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
