"""Every recording in hardware/recordings/ (made on a real TPU with `pallas-check record`)
replayed on the CPU: the simulation must agree with the chip (exit 0). With the folder
empty there is nothing to replay, and nothing fails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pallas_check.cli.app import app

ROOT = Path(__file__).resolve().parent.parent
RECORDINGS = sorted((ROOT / "hardware" / "recordings").glob("*.npz"))


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.name)
def test_the_simulation_agrees_with_the_chip(path, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # recordings keep their script's path from the root
    out = tmp_path / "replay.json"
    result = CliRunner().invoke(app, ["replay", str(path), "--format", "json", "-o", str(out)],
                                catch_exceptions=False)
    report = json.loads(out.read_text()) if out.exists() else None
    assert result.exit_code == 0, (report and _disagreement(report)) or result.output


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
