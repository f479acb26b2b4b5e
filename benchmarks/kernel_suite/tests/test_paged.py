"""The vendored paged attention (decode: one query per sequence, grouped heads)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpu_kernels import runtime, vendored

pytestmark = pytest.mark.skipif(not runtime.can_run(), reason="needs a TPU")
HIGHEST = jax.lax.Precision.HIGHEST


def _reference(q, k_pages, v_pages, lengths, page_indices):
    batch, q_heads, d = q.shape
    kv_heads, _, page, _ = k_pages.shape
    out = []
    for b in range(batch):
        k = k_pages[:, page_indices[b]].reshape(kv_heads, -1, d)[:, :lengths[b]]
        v = v_pages[:, page_indices[b]].reshape(kv_heads, -1, d)[:, :lengths[b]]
        group = q_heads // kv_heads
        k, v = jnp.repeat(k, group, 0), jnp.repeat(v, group, 0)
        logits = jnp.einsum("hd,hkd->hk", q[b], k, precision=HIGHEST)
        out.append(jnp.einsum("hk,hkd->hd", jax.nn.softmax(logits, -1), v, precision=HIGHEST))
    return jnp.stack(out)


def _case(batch, kv_heads, q_heads, pages_per_seq, seed):
    d, page = 128, 16
    keys = jax.random.split(jax.random.key(seed), 4)
    total = batch * pages_per_seq
    bf16_exact = lambda x: x.astype(jnp.bfloat16).astype(jnp.float32)
    k_pages = bf16_exact(jax.random.normal(keys[0], (kv_heads, total, page, d)))
    v_pages = bf16_exact(jax.random.normal(keys[1], (kv_heads, total, page, d)))
    q = bf16_exact(jax.random.normal(keys[2], (batch, q_heads, d)))
    page_indices = jax.random.permutation(keys[3], total).astype(jnp.int32).reshape(
        batch, pages_per_seq)
    return q, k_pages, v_pages, page_indices


@pytest.mark.parametrize("batch,kv_heads,q_heads", [(2, 1, 8), (4, 2, 8)])
def test_paged_attention(batch, kv_heads, q_heads):
    q, k_pages, v_pages, page_indices = _case(batch, kv_heads, q_heads, 4, seed=batch)
    for lengths in ([64] * batch, [1 + 15 * b for b in range(batch)]):
        lengths = jnp.asarray(lengths, jnp.int32)
        got = vendored.paged_attention(q, k_pages, v_pages, lengths, page_indices)
        np.testing.assert_allclose(got, _reference(q, k_pages, v_pages, lengths, page_indices),
                                   rtol=2e-2, atol=2e-2)


def test_paged_attention_grid_over_pages():
    q, k_pages, v_pages, page_indices = _case(2, 2, 4, 4, seed=7)
    lengths = jnp.asarray([40, 64], jnp.int32)
    got = vendored.paged_attention(q, k_pages, v_pages, lengths, page_indices,
                                   inline_seq_dim=False)
    np.testing.assert_allclose(got, _reference(q, k_pages, v_pages, lengths, page_indices),
                               rtol=2e-2, atol=2e-2)
