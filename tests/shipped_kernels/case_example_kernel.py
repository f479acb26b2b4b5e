"""Shipped kernel case: jax.experimental.pallas.ops.tpu.example_kernel.double.

Run as a user would: ``double(x)`` (no grid, whole-array blocks).  The public
function has no ``interpret`` parameter, so none is passed.

CASE_INTERPRET (verification only; unset under the pallas-check interceptor):
  unset  -> call the kernel as-is (the interceptor replaces the lowering)
  "hlo"  -> every pl.pallas_call gets interpret=True (JAX HLO interpreter)
  "tpu"  -> run under pltpu.force_tpu_interpret_mode(pltpu.InterpretParams())
            (CASE_DETECT_RACES=1 turns on the interpreter's race detector)
Verified with: hlo, tpu
"""

NAME = "example_kernel"


# ---------------------------------------------------------------- verification
from _case_common import (  # noqa: E402  (this folder is sys.path[0] when run)
    interpret_ctx as _interpret_ctx, report_races as _report_races,
    verification_setup as _verification_setup, run_case)


# ----------------------------------------------------------------------- calls
def make_calls():
  """[(label, fn, args, ref_fn, rtol, atol)]; fn(*args) invokes the kernel."""
  import jax
  import jax.numpy as jnp
  from jax.experimental.pallas.ops.tpu import example_kernel

  x = jax.random.normal(jax.random.key(0), (8, 128), jnp.float32)
  return [("double_f32", example_kernel.double, (x,), lambda x: x * 2, 0, 0)]


# ------------------------------------------------------------------------ main
def main():
  run_case(NAME, make_calls, _verification_setup, _interpret_ctx, _report_races)


if __name__ == "__main__":
  main()
