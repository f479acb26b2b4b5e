"""The registry of output formats (pallas_check/config/formats.py): every format names a
reporter per command's report that exists and keeps the Reporter contract, and each
command's `--format` offers exactly the formats its report has, from that one table; what
a format is for (people or programs, a progress line beside it) and how the pre-commit
hook merges several scripts' reports in it are the member's too."""

from __future__ import annotations

import importlib
import inspect
import json

import pytest

from pallas_check.config.options import (COMPILE_OPTIONS, DIFF_OPTIONS, RECORD_OPTIONS,
                                         RUN_OPTIONS)
from pallas_check.config.formats import COMPILE, DIFF, NATIVE, RECORD, RUN, Format

REPORTS = (RUN, DIFF, NATIVE, COMPILE, RECORD)


@pytest.mark.parametrize("fmt,report", [(f, r) for f in Format for r in f.reporters],
                         ids=lambda x: getattr(x, "value", x))
def test_every_registered_reporter_exists_and_keeps_the_contract(fmt, report):
    assert report in REPORTS
    reporter = fmt.reporter(report, display=None)
    assert list(inspect.signature(reporter.render).parameters) == ["report", "stream"]


def test_every_report_has_a_table_and_json():
    for report in REPORTS:
        assert {Format.TABLE, Format.JSON} <= set(Format.accepted_by(report)), report


def test_a_report_without_the_format_is_refused():
    with pytest.raises(ValueError, match="the diff report has no sarif format"):
        Format.SARIF.reporter(DIFF)


@pytest.mark.parametrize("options,report", [(RUN_OPTIONS, RUN), (DIFF_OPTIONS, DIFF),
                                            (COMPILE_OPTIONS, COMPILE),
                                            (RECORD_OPTIONS, RECORD)])
def test_each_command_offers_the_formats_of_its_report(options, report):
    (fmt,) = [o for o in options if o.param == "fmt"]
    offered = [member.value for member in fmt.kind]
    assert offered == [f.value for f in Format.accepted_by(report)]
    assert fmt.default.value == "table"
    for f in Format.accepted_by(report):
        assert f.described in fmt.help


def test_run_offers_every_format_and_native_table_or_json():
    assert Format.choices(RUN) is Format
    assert [f.value for f in Format.accepted_by(NATIVE)] == ["table", "json"]


def test_only_the_table_is_for_people_and_json_and_sarif_have_no_progress_beside():
    assert [f for f in Format if f.for_people] == [Format.TABLE]
    assert [f for f in Format if f.progress_beside] == [Format.TABLE, Format.TEXT]


def test_what_a_format_is_for_decides_where_the_scripts_prints_go():
    from pallas_check.deliver.delivery import report_owns_stdout

    for fmt in Format:  # a report for programs owns stdout unless it goes to a file
        assert report_owns_stdout(fmt.value, None) is (not fmt.for_people)
        assert report_owns_stdout(fmt.value, "-") is (not fmt.for_people)
        assert report_owns_stdout(fmt.value, "out.txt") is False


@pytest.mark.parametrize("fmt", list(Format), ids=lambda f: f.value)
def test_every_merge_and_part_check_is_a_function_of_the_formats_module(fmt):
    module = fmt.reporters[RUN].split(":")[0]
    for where in (fmt.merge, fmt.part_check):
        if where is not None:
            assert where.split(":")[0] == module
            assert callable(getattr(importlib.import_module(
                f"pallas_check.report.{module}"), where.split(":")[1]))


def _part(script: str, fmt: Format, exit_code: int) -> tuple[str, str]:
    """A script's `run` report as `pallas-check run --format FMT --output PART` writes it."""
    from pallas_check.config.formats import render
    from pallas_check.report.run_report import RunReport

    report = RunReport(script=script, config={"seed": exit_code}, findings=[], calls=[],
                       exit_code=exit_code)
    return script, render(report, fmt)


def test_the_hook_merges_json_reports_under_reports():
    parts = [_part("a.py", Format.JSON, 0), _part("k/b.py", Format.JSON, 5)]
    merged = Format.JSON.merged(parts)
    assert merged.endswith("}\n") and merged == json.dumps(json.loads(merged), indent=2) + "\n"
    assert json.loads(merged) == {"schema": "pallas-check/hook-report", "schema_version": 1,
                                  "reports": [json.loads(text) for _, text in parts]}
    assert [r["script"] for r in json.loads(merged)["reports"]] == ["a.py", "k/b.py"]
    assert json.loads(Format.JSON.merged([]))["reports"] == []


def test_the_hook_merges_sarif_logs_into_one_log_with_every_run():
    parts = [_part("a.py", Format.SARIF, 0), _part("k/b.py", Format.SARIF, 5)]
    logs = [json.loads(text) for _, text in parts]
    merged = json.loads(Format.SARIF.merged(parts))
    assert len(merged["runs"]) == 2 and merged["runs"] == logs[0]["runs"] + logs[1]["runs"]
    assert {k: v for k, v in merged.items() if k != "runs"} == {
        k: v for k, v in logs[0].items() if k != "runs"}
    assert merged["version"] == "2.1.0"
    assert json.loads(Format.SARIF.merged([])) == {"version": "2.1.0", "runs": []}


def test_the_hook_merges_tables_each_under_its_script_and_text_as_it_is():
    tables = [_part("a.py", Format.TABLE, 0), _part("k/b.py", Format.TABLE, 5)]
    assert Format.TABLE.merged(tables) == (f"== a.py\n{tables[0][1]}"
                                           f"== k/b.py\n{tables[1][1]}")
    texts = [_part("a.py", Format.TEXT, 0), _part("k/b.py", Format.TEXT, 5)]
    assert Format.TEXT.merged(texts) == texts[0][1] + texts[1][1]
    assert Format.TABLE.merged([]) == Format.TEXT.merged([]) == ""


@pytest.mark.parametrize("fmt, bad, message", [
    (Format.JSON, '{"schema": "pallas-check/hook-report", "schema_version": 1}',
     "the report of k/b.py is not a pallas-check JSON report"),
    (Format.SARIF, '{"version": "2.0.0", "runs": []}', "the report of k/b.py is not SARIF"),
    (Format.SARIF, '[]', "the report of k/b.py is not SARIF"),  # JSON, not a SARIF log
    (Format.JSON, '[]', "the report of k/b.py is not a pallas-check JSON report"),
    (Format.JSON, "== a table", "Expecting value"),
])
def test_a_part_that_is_not_our_report_is_refused_before_anything_is_merged(fmt, bad,
                                                                             message):
    with pytest.raises(ValueError, match=message):
        fmt.merged([_part("a.py", fmt, 0), ("k/b.py", bad)])
