"""Which tier ran each call (issue 38), in every report for machines and for people: JSON's
per-call `tier` and `reason` and its `summary.tiers` counts (both keys always), and the
table's and text's one sentence, said only when the compiled tier ran a call."""

from __future__ import annotations

import io
from pathlib import Path

from pallas_check.findings.finding import CallSummary
from pallas_check.report.json import report_dict
from pallas_check.report.run_report import RunReport
from pallas_check.report.table import TableReporter
from pallas_check.report.text import TextReporter

SENTENCE = "2 of 3 calls ran compiled (one XLA computation each); 1 on the engine"


def _report(tmp_path: Path, *tiers: tuple[str, str]) -> RunReport:
    """A clean run whose calls ran on these (tier, reason) pairs, in order."""
    script = tmp_path / "k.py"
    script.write_text("x = 1\n")
    calls = [CallSummary(i, "k", str(script), 1, (2,), 0.0, 0, tier=tier, tier_reason=why)
             for i, (tier, why) in enumerate(tiers)]
    return RunReport(script=str(script), config={"seed": 0}, findings=[], calls=calls,
                     exit_code=0)


def _render(reporter: TableReporter | TextReporter, report: RunReport) -> list[str]:
    stream = io.StringIO()
    reporter.render(report, stream)
    return stream.getvalue().splitlines()


MIXED = (("compiled", ""), ("engine", "remote DMA"), ("compiled", ""))


def test_json_gives_each_calls_tier_and_reason_and_the_counts(tmp_path):
    data = report_dict(_report(tmp_path, *MIXED))
    assert [(c["tier"], c["reason"]) for c in data["calls"]] == list(MIXED)
    assert data["summary"]["tiers"] == {"engine": 1, "compiled": 2}


def test_a_call_summary_runs_on_the_engine_unless_told_otherwise(tmp_path):
    call = CallSummary(0, "k", "k.py", 1, (1,), 0.0, 0)
    assert (call.tier, call.tier_reason) == ("engine", "")
    data = report_dict(_report(tmp_path, ("engine", ""), ("engine", "")))
    assert data["summary"]["tiers"] == {"engine": 2, "compiled": 0}  # both keys, always
    assert all((c["tier"], c["reason"]) == ("engine", "") for c in data["calls"])


def test_the_table_says_how_many_ran_compiled_before_the_summary(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lines = _render(TableReporter(width=200), _report(tmp_path, *MIXED))
    assert lines[-2:] == [SENTENCE, "pallas-check: 0 findings in 3 pallas_calls"]
    every = _render(TableReporter(width=200),
                    _report(tmp_path, ("compiled", ""), ("compiled", "")))
    assert every[-2] == "2 of 2 calls ran compiled (one XLA computation each)"


def test_the_text_format_gives_it_as_a_note_of_the_script(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lines = _render(TextReporter(), _report(tmp_path, *MIXED))
    assert lines == [f"k.py: note: {SENTENCE}", "pallas-check: 0 findings in 3 pallas_calls"]


def test_a_run_all_on_the_engine_reads_as_before(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    engine = _report(tmp_path, ("engine", ""), ("engine", "remote DMA"))
    assert _render(TextReporter(), engine) == ["pallas-check: 0 findings in 2 pallas_calls"]
    table = _render(TableReporter(width=200), engine)
    assert table == ["pallas-check: 0 findings in 2 pallas_calls"]
