"""The vendored flash attention. Inputs rounded to bfloat16 values: the kernel's dots run
at the default precision, which a TPU computes on bfloat16 operands."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpu_kernels import runtime, vendored

pytestmark = pytest.mark.skipif(not runtime.can_run(), reason="needs a TPU")
HIGHEST = jax.lax.Precision.HIGHEST


def _inputs(b, h, s, d, seed):
    keys = jax.random.split(jax.random.key(seed), 3)
    return [jax.random.normal(k, (b, h, s, d)).astype(jnp.bfloat16).astype(jnp.float32)
            for k in keys]


def _reference(q, k, v, causal, sm_scale, segment_ids=None):
    logits = jnp.einsum("bhqd,bhkd->bhqk", q, k, precision=HIGHEST) * sm_scale
    s = q.shape[2]
    allowed = jnp.ones((s, s), bool)
    if causal:
        allowed = jnp.tril(allowed)
    allowed = allowed[None, None]
    if segment_ids is not None:
        same = segment_ids.q[:, :, None] == segment_ids.kv[:, None, :]
        allowed = jnp.logical_and(allowed, same[:, None])
    logits = jnp.where(allowed, logits, -1e30)
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(logits, -1), v, precision=HIGHEST)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b,h,s,d", [(1, 2, 256, 128), (2, 1, 128, 64)])
def test_flash_attention(causal, b, h, s, d):
    q, k, v = _inputs(b, h, s, d, seed=s + d)
    for sm_scale in (1.0, d ** -0.5):
        got = vendored.flash_attention(q, k, v, causal=causal, sm_scale=sm_scale)
        np.testing.assert_allclose(got, _reference(q, k, v, causal, sm_scale),
                                   rtol=2e-2, atol=2e-2)


def test_flash_attention_segments():
    q, k, v = _inputs(1, 2, 256, 128, seed=1)
    segments = (jnp.arange(256) >= 96).astype(jnp.int32)[None]
    ids = vendored.SegmentIds(q=segments, kv=segments)
    got = vendored.flash_attention(q, k, v, causal=True, sm_scale=0.125, segment_ids=ids)
    np.testing.assert_allclose(got, _reference(q, k, v, True, 0.125, ids), rtol=2e-2,
                               atol=2e-2)
