"""Our failures are ours: any exception of pallas-check's own code inside the host
callback (a rule, a specializer, the BlockSpec pipeline) ends the run with exit 4 and one
line, "pallas-check: error: ...", naming the primitive and the user's line being
evaluated when it failed -- on one device as on two (shard_map).

Each script breaks a piece of pallas-check itself (it runs in pallas-check's process),
then runs a correct kernel; in a fresh process, so that nothing broken outlives it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pallas_check.config.exitcodes import ExitCode

ROOT = Path(__file__).resolve().parents[2]

_PRELUDE = """
    import os
    import jax, jax.numpy as jnp, numpy as np
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu
    import pallas_check.engine.call.simulate  # every rule registered: what follows replaces one
    from pallas_check.engine.call import pipeline
    from pallas_check.engine.jaxpr import registry; from pallas_check.engine.jaxpr import halts as errors
    from jax._src.state import primitives as state_primitives

    def broken(*args, **kwargs):
        raise ZeroDivisionError("simulated bug of ours")
"""

# What each script breaks, and what the error line must then say.
_BREAKS = {
    "rule": ("registry.RULES[state_primitives.swap_p] = registry.Rule(broken, False)",
             "ZeroDivisionError: simulated bug of ours (evaluating `swap` at {file}:{store}"
             " in kernel.<locals>._)"),
    "specializer": ("registry.SPECIALIZERS[state_primitives.get_p] = lambda eqn: broken",
                    "ZeroDivisionError: simulated bug of ours (evaluating `get` at"
                    " {file}:{load} in kernel)"),
    "kernel-error-without-a-line": (
        "def refuse(ctx, eqn, invals):\n"
        "    raise errors.KernelError('expected a ref, got tuple')\n"
        "registry.RULES[state_primitives.swap_p] = registry.Rule(refuse, False)",
        "expected a ref, got tuple (evaluating `swap` at {file}:{store} in"
        " kernel.<locals>._)"),
    "specializer-itself": ("registry.SPECIALIZERS[state_primitives.get_p] = broken",
                           "ZeroDivisionError: simulated bug of ours (preparing the rule of"
                           " `get` at {file}:{load} in kernel)"),
    "pipeline": ("pipeline.Pipeline.inputs_ready = broken",
                 "ZeroDivisionError: simulated bug of ours (in {actor} at grid point (0,),"
                 " outside the kernel's equations: its BlockSpec pipeline or program)"),
}

# The store sits in a branch (a cond's sub-program): the error names it, not the cond.
_KERNEL = """
    def kernel(s_ref, x_ref, o_ref):
        scale = s_ref[0].astype(jnp.float32)  # the load

        @pl.when(scale > 0)
        def _():
            o_ref[...] = x_ref[...] * scale  # the store
"""

_ONE = """
    out = pl.pallas_call(
        kernel, grid=(1,),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
    )(jnp.array([2], jnp.int32), jnp.ones((8, 128), jnp.float32))
    print(np.asarray(out).sum())
"""

_TWO = """
    from jax.sharding import Mesh, PartitionSpec as P

    def per_device(s, x):
        return pl.pallas_call(
            kernel, grid=(1,),
            in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM),
                      pl.BlockSpec((8, 128), lambda i: (i, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))(s, x)

    mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
    f = jax.shard_map(per_device, mesh=mesh, in_specs=(P(), P("x")), out_specs=P("x"),
                      check_vma=False)
    out = jax.jit(f)(jnp.array([2], jnp.int32), jnp.ones((16, 128)))
    print(np.asarray(out).sum() if os.environ.get("BLOCKS") else out.shape)
"""


def _run(tmp_path: Path, breaks: str, devices: str):
    """`devices`: "1", "2" (the script reads the result) or "2-async" (it never does: its
    last computation is still running the call when it ends)."""
    script = tmp_path / "kernel_script.py"
    body = textwrap.dedent(_PRELUDE) + breaks + "\n" + textwrap.dedent(_KERNEL) + \
        textwrap.dedent(_ONE if devices == "1" else _TWO)
    script.write_text(body)
    lines = {mark: 1 + next(k for k, text in enumerate(body.splitlines()) if f"# the {mark}"
                            in text) for mark in ("load", "store")}
    report = tmp_path / "report.json"
    args = ["--devices", "2"] if devices != "1" else []
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BLOCKS": "" if "async" in devices else "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pallas_check", "run", *args, "--format", "json", "--output",
         str(report), str(script)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    return proc, json.loads(report.read_text()), str(script), lines


# The rule's and the pipeline's on two devices too; the others take the rule's path.
_CASES = [(broken, "1") for broken in _BREAKS] + [
    ("rule", "2"), ("pipeline", "2"), ("rule", "2-async")]


@pytest.mark.parametrize("broken,devices", _CASES)
def test_a_failure_of_ours_is_exit_4_naming_the_primitive_and_the_line(
        tmp_path, broken, devices):
    breaks, said = _BREAKS[broken]
    proc, report, file, lines = _run(tmp_path, breaks, devices)
    assert proc.returncode == ExitCode.INTERNAL, proc.stderr
    actor = "core 0" if devices == "1" else "device 0 core 0"
    text = said.format(file=file, actor=actor, **lines)
    if broken == "kernel-error-without-a-line":
        expected = f"kernel: {text}"
    else:
        expected = f"internal error while simulating kernel: {text}"
    assert report["internal_error"] == expected
    assert proc.stderr.strip().splitlines()[-1] == f"pallas-check: error: {expected}"
    assert "Traceback" not in proc.stderr
