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
