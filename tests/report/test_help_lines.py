"""A finding's `help` (how to fix this one defect) in every format: the table and text
formats' `help:` line after the `note:` lines, JSON's `help` field (null where none),
SARIF's result (after the message, and as a property); and the summary's counts in one
wording, pluralised, on stdout and stderr alike (issue 36, items 2 and 4)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from pallas_check.findings.finding import CallSummary, Finding, FindingKind, KernelInfo, SourceFrame
from pallas_check.report.json import report_dict
from pallas_check.report.run_report import RunReport
from pallas_check.report.sarif import report_sarif
from pallas_check.report.table import TableReporter
from pallas_check.report.text import TextReporter
from pallas_check.findings.units import findings_in_calls, plural

from report.test_sarif import validate_sarif

HELP = "move its wait (`copy.wait()`, line 26) before the read of buf at line 25"


def _report(tmp_path: Path, helped: bool = True) -> RunReport:
    script = tmp_path / "k.py"
    script.write_text("x = 1\n")
    frame = SourceFrame(str(script), 1, "kernel", "x = 1", column=1)
    finding = Finding(FindingKind.UNINITIALIZED, "output o depends on buf", KernelInfo("k"),
                      0, (0,), "core 0", "buf", "VMEM", ((0, 8),), (frame,), seed=0,
                      help=HELP if helped else None)
    call = CallSummary(0, "k", str(script), 1, (1,), 0.0, 1)
    return RunReport(script=str(script), config={"seed": 0}, findings=[finding],
                     calls=[call], exit_code=1)


def _render(reporter: object, report: RunReport) -> str:
    stream = io.StringIO()
    reporter.render(report, stream)  # type: ignore[attr-defined]
    return stream.getvalue()


def test_text_gives_the_help_line_after_the_note(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lines = _render(TextReporter(), _report(tmp_path)).splitlines()
    assert lines[1].startswith("k.py:1:1: note: replay: ")
    assert lines[2] == f"k.py:1:1: help: {HELP}"
    assert lines[3] == "pallas-check: 1 finding in 1 pallas_call"
    assert not any("help:" in line for line in _render(
        TextReporter(), _report(tmp_path, helped=False)).splitlines())


def test_the_table_gives_the_help_line_wide_and_narrow(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for width in (60, 240):  # one block per finding; the table
        lines = _render(TableReporter(width=width), _report(tmp_path)).splitlines()
        note = next(i for i, line in enumerate(lines) if line.strip().startswith("note: replay"))
        at = next(i for i, line in enumerate(lines) if line.strip().startswith("help: "))
        assert at > note, width  # after the notes, as rustc puts it
        helped = " ".join(line.strip() for line in lines[at:-1] if line.strip())
        assert helped == f"help: {HELP}", width
        assert lines[-1] == "pallas-check: 1 finding in 1 pallas_call"


def test_json_has_help_and_null_where_none(tmp_path):
    [finding] = report_dict(_report(tmp_path))["findings"]
    assert finding["help"] == HELP
    [finding] = report_dict(_report(tmp_path, helped=False))["findings"]
    assert "help" in finding and finding["help"] is None
    json.dumps(finding)  # plain JSON


def test_sarif_result_carries_the_help_and_stays_valid(tmp_path):
    log = report_sarif(_report(tmp_path))
    validate_sarif(log)
    [result] = log["runs"][0]["results"]
    assert result["message"]["text"] == f"output o depends on buf\nhelp: {HELP}"
    assert result["properties"]["help"] == HELP
    [plain] = report_sarif(_report(tmp_path, helped=False))["runs"][0]["results"]
    assert plain["message"]["text"] == "output o depends on buf"
    assert "help" not in plain["properties"]


def test_counts_are_pluralised_in_one_wording():
    assert [plural(n, "finding") for n in (0, 1, 2)] == ["0 findings", "1 finding",
                                                         "2 findings"]
    assert findings_in_calls(1, 1) == "1 finding in 1 pallas_call"
    assert findings_in_calls(2, 0) == "2 findings in 0 pallas_calls"


def test_stderr_summary_matches_the_report_summary(cli):
    """The stderr line of a report written to a file says what the report's own summary
    says: `1 finding in 1 pallas_call`, not `1 finding(s) in 1 pallas_call(s)`."""
    root = Path(__file__).resolve().parents[2]
    result = cli("run", str(root / "samples" / "semaphore_leak_bug.py"))
    assert result.report["summary"]["findings"] == 1
    [line] = [line for line in result.stderr.splitlines() if line.startswith("pallas-check:")]
    assert line.startswith("pallas-check: 1 finding in 1 pallas_call; report written to ")
