"""Every recording in hardware/recordings/ (made on a real TPU with `pallas-check record`)
replayed on the CPU: the simulation must agree with the chip (exit 0). The `_ok` samples'
recordings at the top must agree call by call. The `_bug` samples' (`bugs/`) must agree on
the verdict (`replay --expect-findings`): where the chip failed at a call (its compiler
refused the kernel, it halted), ours reports a finding at that call; where it ran the
defect silently, ours reports it, and every kind the sample's docstring expects is among
what ours reported. `pending/` holds recordings that do not agree yet (its README.md)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pallas_check.cli.app import app
from pallas_check.commands import recording
from pallas_check.config import parse_generations
from pallas_check.intercept.tpu_info import DEVICE_KINDS
from scenarios.test_samples import expectations

ROOT = Path(__file__).resolve().parent.parent
RECORDINGS = sorted((ROOT / "hardware" / "recordings").glob("*.npz"))
DEFECTS = sorted((ROOT / "hardware" / "recordings" / "bugs").glob("*.npz"))
# Findings about the report, not a call (a suppression comment that matched nothing):
# the chip has nothing to say of them, and its outputs agree with ours.
REPORT_KINDS = {"unused-suppression"}


def _replay(path: Path, tmp_path: Path, *args: str) -> tuple[int, dict | None, str]:
    out = tmp_path / "replay.json"
    result = CliRunner().invoke(app, ["replay", str(path), *args, "--format", "json",
                                      "-o", str(out)], catch_exceptions=False)
    return result.exit_code, json.loads(out.read_text()) if out.exists() else None, \
        result.output


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.name)
def test_the_simulation_agrees_with_the_chip(path, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # recordings keep their script's path from the root
    code, report, output = _replay(path, tmp_path)
    assert code == 0, (report and _disagreement(report)) or output


@pytest.mark.parametrize("path", DEFECTS, ids=lambda p: p.name)
def test_the_simulation_and_the_chip_agree_on_each_defect(path, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    made = recording.read(path)
    expected = [e for e in expectations(ROOT / made.script) if _on_chip(e, made.chip)]
    kinds = {e["kind"] for e in expected}
    stated = expectations(ROOT / made.script)
    assert stated, f"{path.name}: its sample states no expected finding"
    if not kinds or kinds <= REPORT_KINDS:
        # No defect of the recording chip's to show (core_swap_bug on a v5e, whose one
        # TensorCore runs the cores in turn: no finding there, and neither side finds
        # one) or a finding about the report itself: the values and verdicts must agree.
        code, report, output = _replay(path, tmp_path)
        assert code == 0, (report and _disagreement(report)) or output
        return
    code, report, output = _replay(path, tmp_path, "--expect-findings",
                                   *_dma([e.get("args", "") for e in expected]))
    assert code == 0, (report and _disagreement(report)) or output
    assert report is not None
    found = {kind for call in report["calls"] for kind in call["finding_kinds"]}
    assert kinds <= found, f"{path.name}: expected {sorted(kinds)}, ours {sorted(found)}"


def _on_chip(expected: dict[str, str], chip: str) -> bool:
    """Whether a sample's expected finding is the recording chip's to show: one stated for
    another generation (`args=--tpu v7x`: core_swap_bug's, which a v5e runs one core after
    the other, engine/call/serial.py) is not."""
    words = shlex.split(expected.get("args", ""))
    if "--tpu" not in words:
        return True
    return DEVICE_KINDS[parse_generations(words[words.index("--tpu") + 1])[0]] == chip


def _dma(args: list[str]) -> list[str]:
    """The `--dma` mode a sample's expected finding needs (replay takes it; `--tpu` is the
    recording's chip, and races are on with --expect-findings)."""
    words = [w for text in args for w in shlex.split(text)]
    at = words.index("--dma") if "--dma" in words else None
    return words[at:at + 2] if at is not None else []


def _disagreement(report: dict) -> str:
    """What disagrees, one line each: the message a failing replay shows."""
    lines = [f"{report['script']} on {report['recording']['chip']}:"]
    lines += report["disagreements"]
    for call in report["calls"]:
        where = f"call {call['index']} {call['kernel']} ({call['file']}:{call['line']})"
        if call["disagreement"] or call["error"]:
            lines.append(f"{where}: {call['disagreement'] or call['error']}")
        for o in call["outputs"]:
            if o["mismatches"]:
                lines.append(f"{where}: output {o['name']}: {o['mismatches']} of {o['size']}"
                             f" elements differ, first {o['first_mismatches'][:3]}")
    if report["user_error"] or report["internal_error"]:
        lines.append(str(report["user_error"] or report["internal_error"]))
    return "\n".join(lines)
