import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpu_kernels import fused_mlp, runtime

pytestmark = pytest.mark.skipif(not runtime.can_run(), reason="needs a TPU")
HIGHEST = jax.lax.Precision.HIGHEST


def _weights(d, hidden, seed):
    keys = jax.random.split(jax.random.key(seed), 3)
    return (jax.random.normal(keys[0], (d, hidden)) / np.sqrt(d),
            jax.random.normal(keys[1], (hidden,)) * 0.1,
            jax.random.normal(keys[2], (hidden, d)) / np.sqrt(hidden))


@pytest.mark.parametrize("activation", ["gelu", "silu"])
@pytest.mark.parametrize("m,d,hidden", [(64, 128, 256), (128, 128, 512)])
def test_fused_mlp(activation, m, d, hidden):
    w1, b1, w2 = _weights(d, hidden, m + hidden)
    x = jax.random.normal(jax.random.key(9), (m, d), jnp.float32)
    act = (lambda h: jax.nn.gelu(h, approximate=True)) if activation == "gelu" else jax.nn.silu
    want = jnp.dot(act(jnp.dot(x, w1, precision=HIGHEST) + b1), w2, precision=HIGHEST)
    got = fused_mlp.fused_mlp(x, w1, b1, w2, activation=activation, precision=HIGHEST)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
