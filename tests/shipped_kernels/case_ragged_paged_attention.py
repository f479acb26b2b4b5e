"""Shipped kernel case: jax.experimental.pallas.ops.tpu.ragged_paged_attention.

Run as a user would: ``ragged_paged_attention(q, kv_pages, kv_lens,
page_indices, cu_q_lens, num_seqs, num_kv_pages_per_block=...,
num_queries_per_block=...)``.  The public function has no ``interpret``
parameter, so none is passed.  Block sizes are passed explicitly: without them
the kernel looks up tuned sizes via jax.devices()[0].device_kind and raises
NotImplementedError("TPU version must be 4 or higher.") on CPU.

Mixed batch: 3 live sequences (decode q_len=1, prefill chunks 5 and 10) out
of max_num_seqs=4, 2 query blocks, kv pages fetched from HBM (memory_space
ANY) with double-buffered async copies; the kernel writes scalar-prefetch
state (seq_buf_idx) carried across grid steps.

Calls:
  bf16            bfloat16 q / kv pages (kv ref bitcast to uint32 +
                  pltpu.bitcast to split K and V)
  f32_window_cap  float32, sliding_window + soft_cap + sm_scale (plain
                  strided K/V loads)

CASE_INTERPRET (verification only; unset under the pallas-check interceptor):
  unset  -> call the kernel as-is (the interceptor replaces the lowering)
  "hlo"  -> every pl.pallas_call gets interpret=True (JAX HLO interpreter)
  "tpu"  -> run under pltpu.force_tpu_interpret_mode(pltpu.InterpretParams())
            (CASE_DETECT_RACES=1 turns on the interpreter's race detector)
Verified with: hlo (+ TypedInt.shape patch, see _verification_setup); tpu
mode fails in jax 0.10.2 (ReshapeTransform unsupported by the TPU interpreter)
"""

NAME = "ragged_paged_attention"


# ---------------------------------------------------------------- verification
from _case_common import (  # noqa: E402  (this folder is sys.path[0] when run)
    MODE, interpret_ctx, report_races as _report_races, run_case, verification_setup)


def _verification_setup():
  """Route pl.pallas_call through the HLO interpreter (CASE_INTERPRET=hlo)."""
  if MODE != "hlo":
    return
  # jax 0.10.2 bug, verification only: pltpu.store(ref.at[<python int>], ...,
  # mask=...) reaches pallas' masked-swap discharge rule with a TypedInt index
  # (`not s.shape` -> AttributeError).  The TPU interpreter cannot run this
  # kernel either (its `get` does not support ReshapeTransform), so the HLO
  # interpreter + this one-attribute patch is the verification path.
  from jax._src import literals
  if not hasattr(literals.TypedInt, "shape"):
    literals.TypedInt.shape = ()
  verification_setup()


_interpret_ctx = interpret_ctx


# ----------------------------------------------------------------------- calls
def _reference(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, *,
               sm_scale=1.0, sliding_window=None, soft_cap=None):
  """Plain jax.numpy causal GQA attention, one live sequence at a time."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  hi = jax.lax.Precision.HIGHEST
  cu = np.asarray(cu_q_lens)
  kv_lens = np.asarray(kv_lens)
  _, _, combined, d = kv_pages.shape
  num_kv_heads = combined // 2
  ratio = q.shape[1] // num_kv_heads
  out = jnp.zeros(q.shape, jnp.float32)
  for i in range(int(np.asarray(num_seqs)[0])):
    q_len, kv_len = int(cu[i + 1] - cu[i]), int(kv_lens[i])
    qi = q[cu[i]:cu[i + 1]].astype(jnp.float32)
    kv = kv_pages[page_indices[i]].reshape(-1, combined, d)[:kv_len]
    k = jnp.repeat(kv[:, 0::2].astype(jnp.float32), ratio, axis=1)
    v = jnp.repeat(kv[:, 1::2].astype(jnp.float32), ratio, axis=1)
    s = jnp.einsum("qhd,khd->hqk", qi, k, precision=hi) * sm_scale
    if soft_cap is not None:
      s = soft_cap * jnp.tanh(s / soft_cap)
    q_pos = kv_len - q_len + jnp.arange(q_len)[:, None]
    k_pos = jnp.arange(kv_len)[None, :]
    allowed = k_pos <= q_pos
    if sliding_window is not None:
      allowed = jnp.logical_and(allowed, q_pos - sliding_window < k_pos)
    s = jnp.where(allowed[None], s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    out = out.at[cu[i]:cu[i + 1]].set(
        jnp.einsum("hqk,khd->qhd", p, v, precision=hi))
  return out


def make_calls():
  """[(label, fn, args, ref_fn, rtol, atol)]; fn(*args) invokes the kernel."""
  import functools
  import jax
  import jax.numpy as jnp
  from jax.experimental.pallas.ops.tpu import ragged_paged_attention as rpa

  max_num_seqs, pages_per_seq, page_size, d = 4, 4, 16, 128
  num_q_heads, num_kv_heads = 4, 2
  total_pages = max_num_seqs * pages_per_seq
  q_lens = [1, 5, 10]
  kv_lens = jnp.array([20, 17, 40, 0], jnp.int32)
  cu_q_lens = jnp.array([0, 1, 6, 16, 16], jnp.int32)
  num_seqs = jnp.array([len(q_lens)], jnp.int32)
  num_tokens = sum(q_lens)  # 16 = max_num_batched_tokens
  keys = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(keys[0], (num_tokens, num_q_heads, d), jnp.float32)
  kv_pages = jax.random.normal(
      keys[1], (total_pages, page_size, 2 * num_kv_heads, d), jnp.float32)
  page_indices = jax.random.permutation(keys[2], total_pages).astype(
      jnp.int32).reshape(max_num_seqs, pages_per_seq)
  blocks = dict(num_kv_pages_per_block=2, num_queries_per_block=8)

  def kernel(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, **kw):
    return rpa.ragged_paged_attention(q, kv_pages, kv_lens, page_indices,
                                      cu_q_lens, num_seqs, **blocks, **kw)

  opts = dict(sm_scale=0.25, sliding_window=12, soft_cap=5.0)
  bf16 = lambda x: x.astype(jnp.bfloat16)
  return [
      ("bf16", kernel,
       (bf16(q), bf16(kv_pages), kv_lens, page_indices, cu_q_lens, num_seqs),
       _reference, 2e-2, 2e-2),
      ("f32_window_cap", functools.partial(kernel, **opts),
       (q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs),
       functools.partial(_reference, **opts), 2e-3, 2e-3),
  ]


# ------------------------------------------------------------------------ main
def main():
  run_case(NAME, make_calls, _verification_setup, _interpret_ctx, _report_races)


if __name__ == "__main__":
  main()
