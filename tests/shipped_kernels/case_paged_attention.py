"""Shipped kernel case: jax.experimental.pallas.ops.tpu.paged_attention.

Run as a user would: ``paged_attention(q, k_pages, v_pages, lengths,
page_indices, pages_per_compute_block=..., megacore_mode=...,
inline_seq_dim=...)``.  The public function has no ``interpret`` parameter,
so none is passed.  The kernel reads K/V pages straight from HBM (memory_space
ANY) with manual double-buffered async copies (DMA semaphores), and uses four
scalar-prefetch operands, two of which (buffer index, init flag) it writes.

Calls:
  inline_f32           inline_seq_dim=True (fori_loop over kv blocks inside
                       one grid step), 2 q heads per kv head (squeezed q block)
  grid_seq_kv_head     inline_seq_dim=False (kv blocks on the grid; DMA for
                       step i+1 started in step i), megacore_mode="kv_head",
                       8 q heads per kv head
  int8_batch_megacore  int8 QuantizedTensor k/v pages (+ scales pages),
                       megacore_mode="batch", inline_seq_dim=False

CASE_INTERPRET (verification only; unset under the pallas-check interceptor):
  unset  -> call the kernel as-is (the interceptor replaces the lowering)
  "hlo"  -> every pl.pallas_call gets interpret=True (JAX HLO interpreter)
  "tpu"  -> run under pltpu.force_tpu_interpret_mode(pltpu.InterpretParams())
            (CASE_DETECT_RACES=1 turns on the interpreter's race detector)
Verified with: hlo, tpu (2 simulated cores, see TPU_CORES)
"""

NAME = "paged_attention"
# megacore_mode != None splits grid axis 0 ("parallel", size 2) across two
# TensorCores, each with its own copy of the scalar-prefetch refs; on a single
# core the second half waits on a DMA nobody started (documented caveat "the
# kernel may hang").  The TPU interpreter therefore simulates 2 cores.
TPU_CORES = 2


# ---------------------------------------------------------------- verification
from _case_common import (  # noqa: E402  (this folder is sys.path[0] when run)
    interpret_ctx, report_races as _report_races,
    verification_setup as _verification_setup, run_case)


def _interpret_ctx():
  return interpret_ctx(TPU_CORES)


# ----------------------------------------------------------------------- calls
def _reference(q, k_pages, v_pages, lengths, page_indices):
  """Plain jax.numpy grouped-query attention over gathered pages."""
  import jax
  import jax.numpy as jnp
  hi = jax.lax.Precision.HIGHEST
  b, num_q_heads, d = q.shape
  num_kv_heads, _, page_size, _ = k_pages.shape
  g = num_q_heads // num_kv_heads
  # [kv_heads, b, pages_per_seq, page_size, d] -> [b, kv_heads, T, d]
  k = k_pages[:, page_indices].reshape(num_kv_heads, b, -1, d).swapaxes(0, 1)
  v = v_pages[:, page_indices].reshape(num_kv_heads, b, -1, d).swapaxes(0, 1)
  qg = q.reshape(b, num_kv_heads, g, d)
  s = jnp.einsum("bhgd,bhtd->bhgt", qg, k, precision=hi)
  valid = jnp.arange(k.shape[2])[None, :] < lengths[:, None]  # [b, T]
  s = jnp.where(valid[:, None, None, :], s, -jnp.inf)
  p = jax.nn.softmax(s, axis=-1)
  o = jnp.einsum("bhgt,bhtd->bhgd", p, v, precision=hi)
  return o.reshape(b, num_q_heads, d)


def make_calls():
  """[(label, fn, args, ref_fn, rtol, atol)]; fn(*args) invokes the kernel."""
  import jax
  import jax.numpy as jnp
  from jax.experimental.pallas.ops.tpu import paged_attention as pa
  from jax.experimental.pallas.ops.tpu.paged_attention import quantization_utils as qu

  d, page_size, pages_per_seq, ppcb = 128, 16, 4, 2
  batch, kv_heads = 2, 2
  total_pages = batch * pages_per_seq
  keys = jax.random.split(jax.random.key(0), 8)
  # The kernel casts loaded K/V pages to bfloat16 before the dots; make the
  # f32 pages exactly representable in bfloat16 so the reference matches.
  bf16_exact = lambda x: x.astype(jnp.bfloat16).astype(jnp.float32)
  k_pages = bf16_exact(jax.random.normal(
      keys[0], (kv_heads, total_pages, page_size, d), jnp.float32))
  v_pages = bf16_exact(jax.random.normal(
      keys[1], (kv_heads, total_pages, page_size, d), jnp.float32))
  page_indices = jax.random.permutation(keys[2], total_pages).astype(
      jnp.int32).reshape(batch, pages_per_seq)
  lengths = jnp.array([40, 64], jnp.int32)  # partial last block for seq 0
  q4 = jax.random.normal(keys[3], (batch, 4, d), jnp.float32)
  q16 = jax.random.normal(keys[4], (batch, 16, d), jnp.float32)

  def inline(q, kp, vp, lengths, idx):
    return pa.paged_attention(q, kp, vp, lengths, idx,
                              pages_per_compute_block=ppcb)

  def grid_kv_head(q, kp, vp, lengths, idx):
    return pa.paged_attention(q, kp, vp, lengths, idx,
                              pages_per_compute_block=ppcb,
                              megacore_mode="kv_head", inline_seq_dim=False)

  kq = qu.quantize_to_int8(k_pages)
  vq = qu.quantize_to_int8(v_pages)

  def int8_batch(q, kw, ks, vw, vs, lengths, idx):
    return pa.paged_attention(q, qu.QuantizedTensor(kw, ks),
                              qu.QuantizedTensor(vw, vs), lengths, idx,
                              pages_per_compute_block=ppcb,
                              megacore_mode="batch", inline_seq_dim=False)

  def int8_ref(q, kw, ks, vw, vs, lengths, idx):
    k = qu.from_int8(kw, ks, jnp.float32)
    v = qu.from_int8(vw, vs, jnp.float32)
    return _reference(q, k, v, lengths, idx)

  return [
      ("inline_f32", inline, (q4, k_pages, v_pages, lengths, page_indices),
       _reference, 1e-3, 1e-3),
      ("grid_seq_kv_head", grid_kv_head,
       (q16, k_pages, v_pages, lengths, page_indices), _reference, 1e-3, 1e-3),
      ("int8_batch_megacore", int8_batch,
       (q4, kq.weight, kq.scales, vq.weight, vq.scales, lengths, page_indices),
       int8_ref, 1e-3, 1e-3),
  ]


# ------------------------------------------------------------------------ main
def main():
  run_case(NAME, make_calls, _verification_setup, _interpret_ctx, _report_races)


if __name__ == "__main__":
  main()
