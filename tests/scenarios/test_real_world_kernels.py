"""Kernels people write (issue 14, items 1-4): a scoped semaphore signalled from another
device before its owner enters the scope, DMAs addressed to a core of a TensorCore mesh,
stride-0 loads, and a report that survives pallas-check's own failure.

The correct samples run clean with the right output under every DMA mode; their buggy twins
are checked by test_samples.py (their docstrings state the exact finding).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from _cli_worker import CliRun, run_cli
from scenarios.test_samples import run_args

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "samples"
MODES = (["--dma", "on_wait"], ["--dma", "eager"],
         ["--dma", "random", "--schedules", "50", "--keep-going"])


def check(sample: str, *args: str) -> CliRun:
    return run_cli(["run", *args, "--races",
                    "--format", "json", str(SAMPLES / sample)],
                   cwd=ROOT, timeout=600)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: " ".join(m))
@pytest.mark.parametrize("sample, devices", [("ring_allreduce_ok.py", "4"),
                                             ("reduce_scatter_ok.py", "4"),
                                             ("core_swap_ok.py", "1"),
                                             ("zero_stride_ok.py", "1")])
def test_correct_kernels_are_clean_with_the_right_output_in_every_mode(sample, devices,
                                                                       mode):
    tpu = re.search(r"--tpu \S+", run_args(SAMPLES / sample))  # (core_swap_ok: v7x)
    result = check(sample, "--devices", devices, *(tpu.group().split() if tpu else ()), *mode)
    report = json.loads(result.stdout)
    assert result.returncode == 0, result.stderr[-3000:]
    assert report["findings"] == [] and len(report["calls"]) == 1
    assert "output matches" in result.stderr  # the script's own check (its print)


def test_a_device_id_naming_no_axis_is_a_one_line_error(tmp_path):
    script = tmp_path / "bad_axis.py"
    script.write_text((SAMPLES / "core_swap_ok.py").read_text().replace(
        'device_id={"core": other}', 'device_id={"cores": other}'))
    result = run_cli(["run", str(script)], cwd=tmp_path, timeout=300)
    assert result.returncode == 4
    assert result.stderr.strip().splitlines()[-1].startswith(
        "pallas-check: error: swap_kernel: device id names the axis 'cores', which is not an"
        " axis of this call (axes: core)")


def test_a_stride_0_store_is_refused_as_on_tpu(tmp_path):
    script = tmp_path / "store.py"
    script.write_text(
        "import jax, jax.numpy as jnp\n"
        "from jax.experimental import pallas as pl\n"
        "def k(x_ref, o_ref):\n"
        "    o_ref[pl.ds(0, 8, stride=0), :] = x_ref[...]\n"
        "pl.pallas_call(k, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))(\n"
        "    jnp.zeros((8, 128)))\n")
    result = run_cli(["run", str(script)], cwd=tmp_path, timeout=300)
    assert result.returncode == 4
    assert "with a stride of 0" in result.stderr and "store.py:4 in k" in result.stderr


TWO_CALLS = """\
import sys
sys.path.insert(0, {samples!r})
import jax, jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding, PartitionSpec as P
import ring_allreduce_ok as ok


def broken_kernel(x_ref, o_ref):
    sem = pl.get_global(pltpu.SemaphoreType.REGULAR)  # not supported by pallas-check
    pl.semaphore_signal(sem, 1)
    o_ref[...] = x_ref[...]


def broken(x):
    return pl.pallas_call(broken_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


mesh = jax.make_mesh((4,), ("x",))
x = jax.device_put(jnp.ones((32, 128), jnp.float32), NamedSharding(mesh, P("x")))
for fn in (ok.allreduce, broken):
    jax.block_until_ready(jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("x"),
                                                out_specs=P("x"), check_vma=False))(x))
"""


def test_a_failure_of_ours_still_reports_every_call_and_no_stray_traceback(tmp_path):
    """Exit 4 on the second call of a 4-device script: the report lists the first call and
    the failing one (marked), and JAX's exit handlers print nothing of ours."""
    script = tmp_path / "second_call_fails.py"
    script.write_text(TWO_CALLS.format(samples=str(SAMPLES)))
    result = subprocess.run([sys.executable, "-m", "pallas_check", "run", "--devices", "4",
                             "--format", "json", str(script)],
                            capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == 4, result.stderr
    report = json.loads(result.stdout)
    assert [(c["kernel"], c["failed"]) for c in report["calls"]] == [
        ("allreduce_kernel", False), ("broken_kernel", True)]
    assert "get_global" in report["internal_error"], report["internal_error"]
    assert "Exception ignored" not in result.stderr
    assert "pallas_check/" not in result.stderr  # no frame of ours
