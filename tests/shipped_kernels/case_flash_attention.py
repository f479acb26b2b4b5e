"""Shipped kernel case: jax.experimental.pallas.ops.tpu.flash_attention.

Run as a user would: ``flash_attention(q, k, v, ab, segment_ids, causal=...,
sm_scale=..., block_sizes=BlockSizes(...))``, forward and backward (jax.grad
through the kernel's custom_vjp -> _flash_attention_bwd_dkv and
_flash_attention_bwd_dq pallas_calls).  The public function has no
``interpret`` parameter, so none is passed.

Calls:
  fwd_causal_ab_seg  multi-step fwd kernel (block_k < kv_seq_len, VMEM scratch,
                     causal block skipping, bias, segment ids)
  grad_causal_ab_seg fwd (save_residuals) + dkv kernel + dq kernel, grads wrt
                     q, k, v and the bias ab
  fwd_single_step    block_k == kv_seq_len single-step kernel, block_b = 2

CASE_INTERPRET (verification only; unset under the pallas-check interceptor):
  unset  -> call the kernel as-is (the interceptor replaces the lowering)
  "hlo"  -> every pl.pallas_call gets interpret=True (JAX HLO interpreter)
  "tpu"  -> run under pltpu.force_tpu_interpret_mode(pltpu.InterpretParams())
            (CASE_DETECT_RACES=1 turns on the interpreter's race detector)
Verified with: hlo, tpu
"""

NAME = "flash_attention"


# ---------------------------------------------------------------- verification
from _case_common import (  # noqa: E402  (this folder is sys.path[0] when run)
    interpret_ctx as _interpret_ctx, report_races as _report_races,
    verification_setup as _verification_setup, run_case)


# ----------------------------------------------------------------------- calls
def _reference(q, k, v, ab, seg_q, seg_kv, *, causal, sm_scale):
  """Plain jax.numpy attention (same masking convention as the kernel)."""
  import jax
  import jax.numpy as jnp
  mask_value = -0.7 * float(jnp.finfo(jnp.float32).max)
  hi = jax.lax.Precision.HIGHEST
  s = jnp.einsum("bhqd,bhkd->bhqk", q, k, precision=hi)
  if ab is not None:
    s = s + ab
  s = s * sm_scale
  mask = None
  if seg_q is not None:
    mask = (seg_q[:, :, None] == seg_kv[:, None, :])[:, None]
  if causal:
    qi = jnp.arange(q.shape[2])[:, None]
    ki = jnp.arange(k.shape[2])[None, :]
    cm = (ki <= qi)[None, None]
    mask = cm if mask is None else jnp.logical_and(mask, cm)
  if mask is not None:
    s = s + jnp.where(mask, 0.0, mask_value)
  p = jax.nn.softmax(s, axis=-1)
  return jnp.einsum("bhqk,bhkd->bhqd", p, v, precision=hi)


def make_calls():
  """[(label, fn, args, ref_fn, rtol, atol)]; fn(*args) invokes the kernel."""
  import jax
  import jax.numpy as jnp
  from jax.experimental.pallas.ops.tpu import flash_attention as fa

  keys = jax.random.split(jax.random.key(0), 8)
  b, h, s, d = 1, 2, 256, 128
  q = jax.random.normal(keys[0], (b, h, s, d), jnp.float32)
  k = jax.random.normal(keys[1], (b, h, s, d), jnp.float32)
  v = jax.random.normal(keys[2], (b, h, s, d), jnp.float32)
  ab = 0.5 * jax.random.normal(keys[3], (b, h, s, s), jnp.float32)
  do = jax.random.normal(keys[4], (b, h, s, d), jnp.float32)
  seg = (jnp.arange(s) >= 160).astype(jnp.int32)[None, :].repeat(b, 0)
  sm_scale = 0.125

  block_sizes = fa.BlockSizes(
      block_q=128, block_k_major=128, block_k=128, block_b=1,
      block_q_major_dkv=256, block_k_major_dkv=128, block_k_dkv=128,
      block_q_dkv=128,
      block_k_major_dq=256, block_k_dq=128, block_q_dq=128)

  def fwd(q, k, v, ab, seg):
    return fa.flash_attention(
        q, k, v, ab, fa.SegmentIds(q=seg, kv=seg), causal=True,
        sm_scale=sm_scale, block_sizes=block_sizes)

  def fwd_ref(q, k, v, ab, seg):
    return _reference(q, k, v, ab, seg, seg, causal=True, sm_scale=sm_scale)

  def grad_of(f):
    def loss(q, k, v, ab, seg, do):
      return jnp.sum(f(q, k, v, ab, seg) * do)
    return jax.grad(loss, argnums=(0, 1, 2, 3))

  # Single-step variant: block_k == kv_seq_len, block_b = batch = 2.
  b2, s2 = 2, 128
  q2 = jax.random.normal(keys[5], (b2, 1, s2, d), jnp.float32)
  k2 = jax.random.normal(keys[6], (b2, 1, s2, d), jnp.float32)
  v2 = jax.random.normal(keys[7], (b2, 1, s2, d), jnp.float32)
  single_bs = fa.BlockSizes(block_q=128, block_k_major=128, block_k=128,
                            block_b=2)

  def fwd_single(q, k, v):
    return fa.flash_attention(q, k, v, block_sizes=single_bs)

  def fwd_single_ref(q, k, v):
    return _reference(q, k, v, None, None, None, causal=False, sm_scale=1.0)

  return [
      ("fwd_causal_ab_seg", fwd, (q, k, v, ab, seg), fwd_ref, 2e-3, 2e-3),
      ("grad_causal_ab_seg", grad_of(fwd), (q, k, v, ab, seg, do),
       grad_of(fwd_ref), 5e-3, 5e-3),
      ("fwd_single_step", fwd_single, (q2, k2, v2), fwd_single_ref, 2e-3, 2e-3),
  ]


# ------------------------------------------------------------------------ main
def main():
  run_case(NAME, make_calls, _verification_setup, _interpret_ctx, _report_races)


if __name__ == "__main__":
  main()
