import jax.numpy as jnp
import numpy as np
import pytest

from tpu_kernels import ragged_paged, runtime

pytestmark = pytest.mark.skipif(not runtime.can_run(), reason="needs a TPU")


def _reference(q_seqs, k_pages, v_pages, kv_lens, page_table, sm_scale):
    """q_seqs: per sequence (heads, q_len, d)."""
    page = k_pages.shape[1]
    out = []
    for s, q in enumerate(q_seqs):
        kv_len, q_len = kv_lens[s], q.shape[1]
        pages = page_table[s, :-(-kv_len // page)]
        k = np.asarray(k_pages)[pages].reshape(-1, q.shape[-1])[:kv_len]
        v = np.asarray(v_pages)[pages].reshape(-1, q.shape[-1])[:kv_len]
        logits = np.einsum("hqd,kd->hqk", q, k) * sm_scale
        q_pos = kv_len - q_len + np.arange(q_len)[:, None]
        logits = np.where(np.arange(kv_len)[None, :] <= q_pos, logits, -np.inf)
        p = np.exp(logits - logits.max(-1, keepdims=True))
        out.append(np.einsum("hqk,kd->hqd", p / p.sum(-1, keepdims=True), v))
    return out


@pytest.mark.parametrize("q_lens,kv_lens", [([1, 5, 16, 9], [20, 37, 16, 64]),
                                            ([1, 1, 1, 1], [64, 3, 17, 48])])
def test_ragged_paged_attention(q_lens, kv_lens):
    heads, d, page, max_pages, block_q = 2, 128, 16, 4, 8
    rng = np.random.default_rng(sum(kv_lens))
    num_pages = len(q_lens) * max_pages
    k_pages = rng.standard_normal((num_pages, page, d)).astype(np.float32)
    v_pages = rng.standard_normal((num_pages, page, d)).astype(np.float32)
    page_table = rng.permutation(num_pages).astype(np.int32).reshape(len(q_lens), max_pages)
    seqs, blocks, offsets, starts = ragged_paged.work_list(q_lens, block_q)
    tokens = int(starts[-1]) + -(-q_lens[-1] // block_q) * block_q
    q = np.zeros((heads, tokens, d), np.float32)
    q_seqs = []
    for s, q_len in enumerate(q_lens):
        q_seqs.append(rng.standard_normal((heads, q_len, d)).astype(np.float32))
        q[:, starts[s]:starts[s] + q_len] = q_seqs[-1]
    scale = d ** -0.5
    got = ragged_paged.ragged_paged_attention(
        jnp.asarray(q), jnp.asarray(k_pages), jnp.asarray(v_pages),
        jnp.asarray(kv_lens, jnp.int32), jnp.asarray(q_lens, jnp.int32),
        jnp.asarray(page_table), jnp.asarray(seqs), jnp.asarray(blocks), jnp.asarray(offsets),
        block_q=block_q, sm_scale=scale)
    want = _reference(q_seqs, k_pages, v_pages, kv_lens, page_table, scale)
    for s, q_len in enumerate(q_lens):
        np.testing.assert_allclose(np.asarray(got)[:, starts[s]:starts[s] + q_len], want[s],
                                   rtol=1e-4, atol=1e-4)
