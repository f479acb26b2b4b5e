"""Shipped kernel case: jax.experimental.pallas.ops.tpu.all_gather.

Run as a user would: ``all_gather(x, mesh=mesh, axis_name="x")`` on an array
sharded over a 4-device 1-D mesh (shard_map inside; CPU devices are created
with jax_num_cpu_devices=4, which must happen before the JAX backend starts).
No ``interpret`` parameter is exposed, so none is passed.  The kernel is a
bidirectional ring: local async copy, a barrier semaphore signalled on both
neighbours (collective_id=0), then axis_size-1 rounds of remote DMAs
(async_remote_copy with send/recv DMA semaphores), each round forwarding the
half-chunk received in the previous one.

Calls:
  ring4_vmem  f32 (4*8, 128) sharded on 4 devices, memory_space=VMEM (default)

CASE_INTERPRET (verification only; unset under the pallas-check interceptor):
  unset  -> call the kernel as-is (the interceptor replaces the lowering)
  "hlo"  -> not supported: the HLO interpreter has no remote DMAs / device
            semaphores; prints "SKIP all_gather" and returns
  "tpu"  -> run under pltpu.force_tpu_interpret_mode(InterpretParams(
            dma_execution_mode="eager")) (CASE_DETECT_RACES=1 turns on the
            interpreter's race detector).  With the default
            dma_execution_mode="on_wait" and 4 devices, jax 0.10.2's
            interpreter returns NaN for some forwarded half-chunks and
            intermittently reports races on them (2 devices pass in either
            mode); eager mode passes and reports no races.
Verified with: tpu (eager DMA mode)
"""
import contextlib
import os

from _case_common import run_case  # noqa: E402  (this folder is sys.path[0] when run)

NAME = "all_gather"
MODE = os.environ.get("CASE_INTERPRET")
NUM_DEVICES = 4


def _ensure_devices():
  """Ask for NUM_DEVICES CPU devices; only works before backend start-up."""
  import jax
  try:
    jax.config.update("jax_num_cpu_devices", NUM_DEVICES)
  except Exception:  # backend already initialised; check the count below
    pass
  if len(jax.devices()) < NUM_DEVICES:
    raise RuntimeError(
        f"{NAME} needs {NUM_DEVICES} devices, got {len(jax.devices())}; set "
        "jax_num_cpu_devices (or XLA_FLAGS=--xla_force_host_platform_device_"
        f"count={NUM_DEVICES}) before JAX initialises its backend")


# ---------------------------------------------------------------- verification
def _verification_setup():
  pass  # No HLO-interpreter path for this kernel (see module docstring).


def _interpret_ctx():
  if MODE != "tpu":
    return contextlib.nullcontext()
  from jax.experimental.pallas import tpu as pltpu
  params = pltpu.InterpretParams(
      detect_races=os.environ.get("CASE_DETECT_RACES") == "1",
      dma_execution_mode="eager")
  return pltpu.force_tpu_interpret_mode(params)


def _report_races():
  if MODE == "tpu" and os.environ.get("CASE_DETECT_RACES") == "1":
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc
    found = bool(ipc.races is not None and ipc.races.races_found)
    print(f"races_found={found}")


# ----------------------------------------------------------------------- calls
def make_calls():
  """[(label, fn, args, ref_fn, rtol, atol)]; fn(*args) invokes the kernel."""
  _ensure_devices()
  import jax
  import jax.numpy as jnp
  from jax.experimental.pallas.ops.tpu import all_gather as ag

  mesh = jax.make_mesh((NUM_DEVICES,), ("x",))
  x = jax.random.normal(jax.random.key(0), (NUM_DEVICES * 8, 128), jnp.float32)
  x = jax.device_put(
      x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x")))

  def fn(x):
    return ag.all_gather(x, mesh=mesh, axis_name="x")

  return [("ring4_vmem", fn, (x,), lambda x: x, 0, 0)]


# ------------------------------------------------------------------------ main
def main():
  if MODE == "hlo":
    print(f"SKIP {NAME}: the HLO interpreter cannot run remote DMAs; "
          "use CASE_INTERPRET=tpu")
    return
  run_case(NAME, make_calls, _verification_setup, _interpret_ctx, _report_races)


if __name__ == "__main__":
  main()
