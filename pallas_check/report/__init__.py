"""Reporters: each renders a finished `RunReport` in one format (one module per format)."""

from __future__ import annotations

import io
import json as _json  # (the name `json` is this package's own json module once imported)
from typing import Any, Callable, Protocol, TextIO

from pallas_check.report.model import RunReport


class Reporter(Protocol):
    """The contract every output format implements."""

    def render(self, report: RunReport, stream: TextIO) -> None: ...


FORMATS = ("table", "json", "sarif", "text")  # the names `--format` accepts


def reporter_for(fmt: str, *, ascii_only: bool = False, width: int | None = None,
                 display: Any = None) -> Reporter:
    """The reporter of a format name ('table', 'json', 'sarif', 'text'). `display`
    (report.console.Display: width, colours, boxes), ascii_only and width describe where a
    table will be shown; the other formats ignore them."""
    if fmt == "table":
        from pallas_check.report.table import TableReporter

        return TableReporter(ascii_only=ascii_only, width=width, display=display)
    if fmt == "text":
        from pallas_check.report.text import TextReporter

        return TextReporter()
    if fmt == "json":
        from pallas_check.report.json import JsonReporter

        return JsonReporter()
    if fmt == "sarif":
        from pallas_check.report.sarif import SarifReporter

        return SarifReporter()
    raise ValueError(f"unknown report format {fmt!r}")


__all__ = ["FORMATS", "Reporter", "RunReport", "reporter_for"]


def render_json_or_table(report: Any, fmt: str, as_dict: Callable[[Any], dict],
                         as_table: Callable[[Any, TextIO], None]) -> str:
    """A command's own report (`compile`, `--native`) as JSON or as its table."""
    buffer = io.StringIO()
    if fmt == "json":
        _json.dump(as_dict(report), buffer, indent=2, default=str)
        buffer.write("\n")
    else:
        as_table(report, buffer)
    return buffer.getvalue()
