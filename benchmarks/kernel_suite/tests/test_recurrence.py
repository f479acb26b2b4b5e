import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpu_kernels import recurrence, runtime

pytestmark = pytest.mark.skipif(not runtime.can_run(), reason="needs a TPU")


def _reference(q, k, v, gates):
    def one_head(q, k, v, g):
        def step(state, xs):
            qt, kt, vt, gt = xs
            state = state * gt[:, None] + jnp.outer(kt, vt)
            return state, qt @ state
        state = jnp.zeros((k.shape[-1], v.shape[-1]), jnp.float32)
        return jax.lax.scan(step, state, (q, k, v, g))[1]
    with jax.default_matmul_precision("highest"):
        return jax.vmap(one_head)(q, k, v, gates)


@pytest.mark.parametrize("t,chunk", [(32, 16), (64, 32)])
def test_gated_linear_attention(t, chunk):
    heads, dk, dv = 2, 128, 128
    keys = jax.random.split(jax.random.key(t), 4)
    q = jax.random.normal(keys[0], (heads, t, dk)) * 0.1
    k = jax.random.normal(keys[1], (heads, t, dk)) * 0.1
    v = jax.random.normal(keys[2], (heads, t, dv))
    gates = jax.nn.sigmoid(jax.random.normal(keys[3], (heads, t, dk)) + 2)
    got = recurrence.gated_linear_attention(q, k, v, gates, chunk=chunk)
    np.testing.assert_allclose(got, _reference(q, k, v, gates), rtol=1e-4, atol=1e-4)
