"""The registry of output formats (pallas_check/report/formats.py): every format names a
reporter per command's report that exists and keeps the Reporter contract, and each
command's `--format` offers exactly the formats its report has, from that one table."""

from __future__ import annotations

import inspect

import pytest

from pallas_check.config.options import COMPILE_OPTIONS, DIFF_OPTIONS, RUN_OPTIONS
from pallas_check.report.formats import COMPILE, DIFF, NATIVE, RUN, Format

REPORTS = (RUN, DIFF, NATIVE, COMPILE)


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
                                            (COMPILE_OPTIONS, COMPILE)])
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
