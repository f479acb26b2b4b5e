"""Shipped kernel case: jax.experimental.pallas.ops.tpu.splash_attention.

Run as a user would: build a kernel with ``make_splash_mha`` /
``make_splash_mqa_single_device(mask, block_sizes=..., ...)`` and call it on
[heads, seq, head_dim] arrays (jax.vmap over the batch, as users do), forward
and jax.grad.  These factories expose ``interpret``; it is passed (True) only
when CASE_INTERPRET=hlo and otherwise left at its default.

Calls:
  mha_numpy_mask_fwd   vmap(batch=2) MHA, per-head NumpyMask (causal /
                       causal+window) -> block-sparse grid driven by 3
                       scalar-prefetch arrays + partial-mask-block operand,
                       segment ids
  mha_numpy_mask_grad  same, jax.grad: separate dq and dkv backward kernels
  mqa_local_fwd_grad   MQA with a LocalMask (in-kernel mask_function via the
                       q_sequence operand), block_kv=256 with
                       block_kv_compute=128, K in SEQ_MINOR layout, logit
                       soft-cap, attention sinks (SMEM operand), fused
                       backward kernel (dq+dk+dv in one pallas_call)

CASE_INTERPRET (verification only; unset under the pallas-check interceptor):
  unset  -> call the kernel as-is (the interceptor replaces the lowering)
  "hlo"  -> interpret=True is passed to the kernel factories (HLO interpreter)
  "tpu"  -> run under pltpu.force_tpu_interpret_mode(pltpu.InterpretParams())
            (CASE_DETECT_RACES=1 turns on the interpreter's race detector)
Verified with: hlo.  tpu mode fails on the vmapped calls in jax 0.10.2 (the
TPU interpreter zips the 4-D vmapped grid with the 3 dimension_semantics);
mqa_local_fwd_grad alone passes in tpu mode with the race detector on.
"""

NAME = "splash_attention"


# ---------------------------------------------------------------- verification
from _case_common import (  # noqa: E402  (this folder is sys.path[0] when run)
    MODE, interpret_ctx as _interpret_ctx, report_races as _report_races,
    verification_setup as _verification_setup, run_case)


# ----------------------------------------------------------------------- calls
def _interpret_kw():
  return {"interpret": True} if MODE == "hlo" else {}


def _reference(mask, q, k, v, seg_q=None, seg_kv=None, sinks=None,
               soft_cap=None):
  """Plain jax.numpy attention for one sequence. mask: bool [H, Sq, Skv]."""
  import jax
  import jax.numpy as jnp
  hi = jax.lax.Precision.HIGHEST
  mask_value = -0.7 * float(jnp.finfo(jnp.float32).max)
  if k.ndim == 2:  # MQA: one kv head shared by all q heads
    k = jnp.broadcast_to(k, (q.shape[0], *k.shape))
    v = jnp.broadcast_to(v, (q.shape[0], *v.shape))
  s = jnp.einsum("hqd,hkd->hqk", q, k, precision=hi)
  mask = jnp.asarray(mask)
  if seg_q is not None:
    mask = jnp.logical_and(mask, (seg_q[:, None] == seg_kv[None, :])[None])
  if soft_cap is not None:
    s = soft_cap * jnp.tanh(s / soft_cap)
  s = jnp.where(mask, s, mask_value)
  m = s.max(axis=-1)
  if sinks is not None:
    m = jnp.maximum(m, sinks[:, None])
  p = jnp.exp(s - m[..., None])
  l = p.sum(axis=-1)
  if sinks is not None:
    l = l + jnp.exp(sinks[:, None] - m)
  return jnp.einsum("hqk,hkd->hqd", p / l[..., None], v, precision=hi)


def make_calls():
  """[(label, fn, args, ref_fn, rtol, atol)]; fn(*args) invokes the kernel."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.experimental.pallas.ops.tpu import splash_attention as splash

  batch, heads, seq, d = 2, 2, 256, 128
  keys = jax.random.split(jax.random.key(0), 10)
  normal = lambda key, shape: jax.random.normal(key, shape, jnp.float32)

  # --- A: MHA, NumpyMask per head, segment ids, vmap over batch.
  causal = np.tril(np.ones((seq, seq), np.bool_))
  window = causal & ~np.tril(np.ones((seq, seq), np.bool_), -100)
  dense_a = np.stack([causal, window])
  mask_a = splash.MultiHeadMask([splash.NumpyMask(m) for m in dense_a])
  bs_a = splash.BlockSizes(
      block_q=128, block_kv=128, block_kv_compute=128,
      block_q_dkv=128, block_kv_dkv=128, block_kv_dkv_compute=128,
      block_q_dq=128, block_kv_dq=128)
  kernel_a = splash.make_splash_mha(mask_a, block_sizes=bs_a, head_shards=1,
                                    q_seq_shards=1, **_interpret_kw())
  qa = normal(keys[0], (batch, heads, seq, d))
  ka = normal(keys[1], (batch, heads, seq, d))
  va = normal(keys[2], (batch, heads, seq, d))
  doa = normal(keys[3], (batch, heads, seq, d))
  seg = jnp.broadcast_to((jnp.arange(seq) >= 96).astype(jnp.int32),
                         (batch, seq))

  def fwd_a(q, k, v, seg):
    return jax.vmap(lambda q, k, v, s: kernel_a(
        q, k, v, segment_ids=splash.SegmentIds(q=s, kv=s)))(q, k, v, seg)

  def ref_a(q, k, v, seg):
    return jax.vmap(lambda q, k, v, s: _reference(dense_a, q, k, v, s, s))(
        q, k, v, seg)

  def grad_a(f):
    def loss(q, k, v, seg, do):
      return jnp.sum(f(q, k, v, seg) * do)
    return jax.grad(loss, argnums=(0, 1, 2))

  # --- B: MQA, LocalMask (mask_function), fused bwd, sinks, soft cap.
  local = splash.LocalMask((seq, seq), window_size=(64, 0), offset=0)
  dense_b = np.stack([local[:, :]] * heads)
  mask_b = splash.MultiHeadMask([local] * heads)
  bs_b = splash.BlockSizes(
      block_q=128, block_kv=256, block_kv_compute=128,
      block_q_dkv=128, block_kv_dkv=256, block_kv_dkv_compute=128,
      use_fused_bwd_kernel=True,
      k_layout=splash.QKVLayout.SEQ_MINOR)
  soft_cap = 20.0
  kernel_b = splash.make_splash_mqa_single_device(
      mask_b, block_sizes=bs_b, attn_logits_soft_cap=soft_cap,
      **_interpret_kw())
  qb = normal(keys[4], (heads, seq, d))
  kb = normal(keys[5], (seq, d))
  vb = normal(keys[6], (seq, d))
  dob = normal(keys[7], (heads, seq, d))
  sinks = normal(keys[8], (heads,))

  def fwd_b(q, k, v, sinks):
    return kernel_b(q, k, v, sinks=sinks)

  def ref_b(q, k, v, sinks):
    return _reference(dense_b, q, k, v, sinks=sinks, soft_cap=soft_cap)

  def fwd_grad_b(f):
    def loss(q, k, v, sinks, do):
      return jnp.sum(f(q, k, v, sinks) * do)
    def run(q, k, v, sinks, do):
      return f(q, k, v, sinks), jax.grad(loss, argnums=(0, 1, 2, 3))(
          q, k, v, sinks, do)
    return run

  return [
      ("mha_numpy_mask_fwd", fwd_a, (qa, ka, va, seg), ref_a, 2e-3, 2e-3),
      ("mha_numpy_mask_grad", grad_a(fwd_a), (qa, ka, va, seg, doa),
       grad_a(ref_a), 5e-3, 5e-3),
      ("mqa_local_fwd_grad", fwd_grad_b(fwd_b), (qb, kb, vb, sinks, dob),
       fwd_grad_b(ref_b), 5e-3, 5e-3),
  ]


# ------------------------------------------------------------------------ main
def main():
  run_case(NAME, make_calls, _verification_setup, _interpret_ctx, _report_races)


if __name__ == "__main__":
  main()
