"""What every shipped-kernel case script shares: how it is verified without pallas-check.

CASE_INTERPRET (verification only; unset under the pallas-check interceptor):
  unset  -> call the kernel as-is (the interceptor replaces the lowering)
  "hlo"  -> every pl.pallas_call gets interpret=True (JAX HLO interpreter)
  "tpu"  -> run under pltpu.force_tpu_interpret_mode(pltpu.InterpretParams())
            (CASE_DETECT_RACES=1 turns on the interpreter's race detector)
"""
import contextlib
import os

MODE = os.environ.get("CASE_INTERPRET")


def verification_setup():
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


def interpret_ctx(num_cores=None):
  """JAX's TPU interpreter for every call (CASE_INTERPRET=tpu), on `num_cores` cores."""
  if MODE != "tpu":
    return contextlib.nullcontext()
  from jax.experimental.pallas import tpu as pltpu
  cores = {} if num_cores is None else {"num_cores_or_threads": num_cores}
  params = pltpu.InterpretParams(
      detect_races=os.environ.get("CASE_DETECT_RACES") == "1", **cores)
  return pltpu.force_tpu_interpret_mode(params)


def report_races():
  if MODE == "tpu" and os.environ.get("CASE_DETECT_RACES") == "1":
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc
    found = bool(ipc.races is not None and ipc.races.races_found)
    print(f"races_found={found}")


def _as_float32(out, expected):
  import numpy as np
  return np.asarray(out, np.float32), np.asarray(expected, np.float32)


def run_case(name, make_calls, setup, ctx, report, comparable=_as_float32):
  """The main() of every case: `setup()`, then under `ctx()` each call's output against
  its reference (compared as `comparable` makes them), then `report()` and `OK name`."""
  import jax
  import numpy as np
  setup()
  with ctx():
    for label, fn, args, ref, rtol, atol in make_calls():
      out = fn(*args)
      expected = ref(*args)
      jax.tree.map(
          lambda o, e: np.testing.assert_allclose(
              *comparable(o, e), rtol=rtol, atol=atol, err_msg=label),
          out, expected)
  report()
  print(f"OK {name}")
