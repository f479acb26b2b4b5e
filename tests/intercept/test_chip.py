"""The chip's compile at the call (intercept/chip.py), in a default `pallas-check run`:
each form a v5e refuses is a finding of the exact kind at the exact line, and the program
sees the exception class the chip's toolchain raises (found by compiling each form with
libtpu's compile-only devices: the real Pallas TPU lowering and Mosaic).

tests/conftest.py turns the compile off for the rest of the suite (PALLAS_CHECK_CHIP_COMPILE=0);
these runs turn it on with the flag, which outranks the variable.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pallas_check.config.exitcodes import ExitCode
from pallas_check.intercept.chip import NOT_CHECKED
from pallas_check.tpu_compile.toolchain import libtpu_missing
from scenarios.test_samples import SAMPLES

KERNELS = Path(__file__).parent / "chip_kernels"

needs_libtpu = pytest.mark.skipif(libtpu_missing() is not None, reason="needs libtpu")

# form -> the class the chip raises (checked against each script's own docstring).
RAISES = {
    "buffered3": "LoweringException",
    "element_low_padding": "JaxRuntimeError",
    "strided_load": "MosaicError",
    "masked_load": "NotImplementedError",
    "triton_op": "NotImplementedError",
    "lane_block": "ValueError",
    "vmapped_block": "ValueError",
    "dma_offset": "MosaicError",
    "triton_params": "AssertionError",
}


def _refused_line(path: Path) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), start=1)
                if "# REFUSED" in line)


@needs_libtpu
@pytest.mark.parametrize("form", sorted(RAISES))
def test_a_default_run_reports_what_the_chip_refuses_and_the_program_sees_it_raised(cli, form):
    path = KERNELS / f"{form}.py"
    assert re.search(rf"Raises: {RAISES[form]}\b", path.read_text())
    result = cli("run", str(path), "--chip-compile")
    # The script ended in the refusal (it re-raises what it caught): a finding, exit 1.
    assert result.exit_code == ExitCode.FINDINGS, result.output
    assert f"raised {RAISES[form]}\n" in result.output
    [finding] = result.findings
    assert (finding["kind"], finding["frames"][0]["line"]) == (
        "compile-error", _refused_line(path)), finding
    assert finding["details"]["raised"] == RAISES[form]
    assert finding["message"].startswith("v5e: ")
    [call] = result.report["calls"]
    assert call["reason"] == "not run: v5e's compiler refuses it"


@needs_libtpu
def test_no_compile_leaves_it_to_the_simulation(cli):
    """--no-compile: the call runs simulated, nothing raises (the old behaviour)."""
    result = cli("run", str(KERNELS / "lane_block.py"), "--no-compile")
    assert result.exit_code == ExitCode.CLEAN, result.output
    assert "raised" not in result.output


@needs_libtpu
def test_a_kernel_the_chip_builds_runs_as_before_and_its_vmem_is_the_compilers(cli):
    """A clean kernel: compiled (once), simulated, no finding; the reckoned VMEM of a call
    that compiled is withdrawn (engine/call/capacity.py's estimate), none here to withdraw."""
    result = cli("run", str(SAMPLES / "compile_block_shape_ok.py"), "--chip-compile")
    assert result.exit_code == ExitCode.CLEAN, result.output
    assert result.findings == []


def test_without_libtpu_the_report_says_once_that_the_compile_was_not_checked(cli, monkeypatch):
    from pallas_check.tpu_compile import toolchain

    monkeypatch.setattr(toolchain, "libtpu_missing", lambda: "no libtpu")
    result = cli("run", str(KERNELS / "lane_block.py"), "--chip-compile", json_report=False)
    assert result.exit_code == ExitCode.CLEAN, result.output
    text = " ".join(result.output.split())  # the note wraps at the terminal's width
    assert text.count("the TPU compile was not checked") == 1
    assert 'pip install "pallas-check[tpu]"' in text
    as_json = cli("run", str(KERNELS / "lane_block.py"), "--chip-compile")
    assert [n for n in as_json.report["notes"] if "not checked" in n] == [NOT_CHECKED]
    off = cli("run", str(KERNELS / "lane_block.py"), "--no-compile", json_report=False)
    assert "not checked" not in off.output


HOOKED = '''\
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def hook_abort_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1.0


def next_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0 + 1.0


def call(kernel, x):
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)  # CALL


x = jnp.ones((8, 128), jnp.float32)
try:
    call(hook_abort_kernel, x)
except RuntimeError as exc:
    print("raised", type(exc).__name__)
print("next", float(call(next_kernel, x)[0, 0]))
'''


@needs_libtpu
def test_a_compiler_abort_is_a_finding_and_the_program_gets_chip_compiler_aborted(
        cli, tmp_path, monkeypatch):
    """libtpu's compiler aborting on a call (made to, by the worker's test hook, on a
    kernel that compiles) ends the worker, not pallas-check: a compile-error at the call's
    line with the compiler's last words and a help line, ChipCompilerAborted raised in the
    program, and the next call compiled by a new worker and run."""
    from pallas_check.tpu_compile import remote, toolchain

    script = tmp_path / "hooked.py"
    script.write_text(HOOKED)
    monkeypatch.setenv("PALLAS_CHECK_TEST_COMPILER_ABORT", "hook_abort_kernel")
    monkeypatch.setenv("PALLAS_CHECK_CACHE_DIR", str(tmp_path / "cache"))  # nothing known
    started = remote.workers_started()
    result = cli("run", str(script), "--chip-compile")
    assert result.exit_code == ExitCode.FINDINGS, result.output
    assert "raised ChipCompilerAborted\nnext 3.0\n" in result.output
    [finding] = result.findings
    line = _refused_line_of(script, "# CALL")
    assert (finding["kind"], finding["frames"][0]["line"], finding["call_index"]) == (
        "compile-error", line, 0)
    assert finding["message"] == (
        "v5e: libtpu's compiler aborted: Check failed: the test hook's abort"
        " (PALLAS_CHECK_TEST_COMPILER_ABORT); the call raises ChipCompilerAborted in the"
        " program, where a TPU host's process ends")
    assert finding["details"]["raised"] == "ChipCompilerAborted"
    assert finding["help"].startswith(
        f"libtpu {toolchain.libtpu_version()}'s compiler crashes on this kernel")
    refused, ran = result.report["calls"]
    assert refused["reason"] == "not run: v5e's compiler refuses it"
    assert ran["kernel"] == "next_kernel" and ran["findings"] == 0
    assert remote.workers_started() >= started + 1  # (the one that aborted was replaced)


def _refused_line_of(path: Path, marker: str) -> int:
    return next(n for n, text in enumerate(path.read_text().splitlines(), start=1)
                if marker in text)


@needs_libtpu
def test_a_warm_run_sends_nothing_to_the_worker(cli, tmp_path, monkeypatch):
    """The outcome cache answers before any worker, and before the call is lowered for
    the TPU (its structure is the key): a second run of a script, with this process's own
    outcomes forgotten, neither lowers nor compiles anything for the chip."""
    from pallas_check.tpu_compile import compiler, remote

    monkeypatch.setenv("PALLAS_CHECK_CACHE_DIR", str(tmp_path / "cache"))
    placed = []
    real_placed = compiler._placed
    monkeypatch.setattr(compiler, "_placed",
                        lambda *args: placed.append(args) or real_placed(*args))
    sample = str(SAMPLES / "compile_block_shape_ok.py")
    sent = remote.jobs_sent()
    assert cli("run", sample, "--chip-compile").exit_code == ExitCode.CLEAN
    assert remote.jobs_sent() == sent + 1 and len(placed) == 1
    compiler._cache.clear()
    assert cli("run", sample, "--chip-compile").exit_code == ExitCode.CLEAN
    assert remote.jobs_sent() == sent + 1 and len(placed) == 1


@needs_libtpu
def test_the_cross_call_dma_sample_compiles_as_the_program_the_chip_runs(cli):
    """samples/cross_call_dma_ok.py runs on a v5e (its `jax.jit` of both calls, checked
    there); compiled alone with its DMA semaphores as the program's results, its first
    call aborts libtpu's compiler, so they are left out of that compile; the second call,
    which takes them, is not compiled alone. A default run and `--compile` are clean."""
    sample = str(SAMPLES / "cross_call_dma_ok.py")
    result = cli("run", sample, "--chip-compile", "--compile", "--tpu", "v5e")
    assert result.exit_code == ExitCode.CLEAN, result.output
    assert result.findings == []
    start, done = result.report["calls"]
    assert (start["kernel"], start["compiled"]["v5e"]["status"]) == ("start_kernel", "ok")
    assert done["kernel"] == "done_kernel" and not done.get("compiled")


_PRESTART = """
import json
import pallas_check
from pallas_check.tpu_compile import remote
with pallas_check.checking(project=False, chip_compile=True):
    pass  # no kernel: only the session's start
print(json.dumps([remote.workers_started(), remote.jobs_sent()]))
"""


@needs_libtpu
def test_a_first_run_starts_the_worker_ahead_and_a_warm_one_does_not(tmp_path):
    """An empty outcome cache (a first run) starts the compile worker as the session
    starts, before any call needs it, and sends it nothing; a folder that holds a success
    (a suite's next run, whose compiles the disk answers) starts none."""
    import json
    import os
    import subprocess
    import sys

    def started(cache: Path) -> list[int]:
        env = {**os.environ, "PALLAS_CHECK_CACHE_DIR": str(cache)}
        done = subprocess.run([sys.executable, "-c", _PRESTART], env=env, check=True,
                              capture_output=True, text=True)
        return list(json.loads(done.stdout.splitlines()[-1]))

    assert started(tmp_path / "first") == [1, 0]
    (tmp_path / "warm" / "chip").mkdir(parents=True)
    (tmp_path / "warm" / "chip" / "0.json").write_text('{"scoped_bytes": 0}')
    assert started(tmp_path / "warm") == [0, 0]
