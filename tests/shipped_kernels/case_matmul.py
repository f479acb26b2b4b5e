"""Shipped kernel case: jax.experimental.pallas.ops.tpu.matmul.matmul.

Run as a user would: ``matmul(x, y, block_shape=..., block_k=...)``.  The
public function has no ``interpret`` parameter, so none is passed.

CASE_INTERPRET (verification only; unset under the pallas-check interceptor):
  unset  -> call the kernel as-is (the interceptor replaces the lowering)
  "hlo"  -> every pl.pallas_call gets interpret=True (JAX HLO interpreter)
  "tpu"  -> run under pltpu.force_tpu_interpret_mode(pltpu.InterpretParams())
            (CASE_DETECT_RACES=1 turns on the interpreter's race detector)
Verified with: hlo, tpu
"""

NAME = "matmul"


# ---------------------------------------------------------------- verification
from _case_common import (  # noqa: E402  (this folder is sys.path[0] when run)
    interpret_ctx as _interpret_ctx, report_races as _report_races,
    verification_setup as _verification_setup, run_case)


# ----------------------------------------------------------------------- calls
def make_calls():
  """[(label, fn, args, ref_fn, rtol, atol)]; fn(*args) invokes the kernel."""
  import jax
  import jax.numpy as jnp
  from jax.experimental.pallas.ops.tpu import matmul as mm

  kx, ky = jax.random.split(jax.random.key(0))
  # grid = (16/8, 256/128, 256/128) = (2, 2, 2); k axis is the reduction.
  x = jax.random.normal(kx, (16, 256), jnp.float32)
  y = jax.random.normal(ky, (256, 256), jnp.float32)

  def fn(x, y):
    return mm.matmul(x, y, block_shape=(8, 128), block_k=128)

  def ref(x, y):
    return jnp.dot(x, y, precision=jax.lax.Precision.HIGHEST)

  return [("matmul_f32", fn, (x, y), ref, 1e-4, 1e-3)]


# ------------------------------------------------------------------------ main
def main():
  run_case(NAME, make_calls, _verification_setup, _interpret_ctx, _report_races)


if __name__ == "__main__":
  main()
