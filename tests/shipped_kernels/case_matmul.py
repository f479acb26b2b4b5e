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
import contextlib
import os

NAME = "matmul"
MODE = os.environ.get("CASE_INTERPRET")


# ---------------------------------------------------------------- verification
def _verification_setup():
  """Route pl.pallas_call through the HLO interpreter (CASE_INTERPRET=hlo)."""
  if MODE != "hlo":
    return
  from jax.experimental import pallas as pl
  orig = pl.pallas_call
  if getattr(orig, "_case_hlo", False):
    return

  def pallas_call(*args, **kwargs):
    if not kwargs.get("interpret"):
      kwargs["interpret"] = True
    return orig(*args, **kwargs)

  pallas_call._case_hlo = True
  pl.pallas_call = pallas_call


def _interpret_ctx():
  if MODE != "tpu":
    return contextlib.nullcontext()
  from jax.experimental.pallas import tpu as pltpu
  params = pltpu.InterpretParams(
      detect_races=os.environ.get("CASE_DETECT_RACES") == "1")
  return pltpu.force_tpu_interpret_mode(params)


def _report_races():
  if MODE == "tpu" and os.environ.get("CASE_DETECT_RACES") == "1":
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc
    found = bool(ipc.races is not None and ipc.races.races_found)
    print(f"races_found={found}")


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
  _verification_setup()
  import jax
  import numpy as np
  with _interpret_ctx():
    for label, fn, args, ref, rtol, atol in make_calls():
      out = fn(*args)
      expected = ref(*args)
      jax.tree.map(
          lambda o, e: np.testing.assert_allclose(
              np.asarray(o, np.float32), np.asarray(e, np.float32),
              rtol=rtol, atol=atol, err_msg=label),
          out, expected)
  _report_races()
  print(f"OK {NAME}")


if __name__ == "__main__":
  main()
