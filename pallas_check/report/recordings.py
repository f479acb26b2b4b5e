"""The report of `pallas-check record`: which calls went into the recording, as a table or
JSON (versioned schema). commands/record.py records and writes the file; this renders."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Protocol, Sequence, TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from pallas_check.findings.finding import JsonObject
from pallas_check.findings.units import plural
from pallas_check.report.comparison import PlacedCall
from pallas_check.report.json import dump, header
from pallas_check.report.table import print_failures

if TYPE_CHECKING:  # annotations only: a file's bytes do not depend on a display
    import numpy as np

    from pallas_check.config.display import Display

SCHEMA = "pallas-check/record"
SCHEMA_VERSION = 1


class KeptCall(PlacedCall, Protocol):
    """One call of the recording, as reported (commands/recording.py's RecordedCall)."""

    @property
    def fingerprint(self) -> str: ...
    @property
    def inputs(self) -> Sequence[np.ndarray]: ...
    @property
    def outputs(self) -> Sequence[np.ndarray]: ...


@dataclasses.dataclass
class RecordReport:
    """What `pallas-check record` reports."""

    script: str
    path: str
    chip: str
    versions: dict[str, str | None]
    calls: Sequence[KeptCall]
    size: int | None  # the file's bytes; None when it could not be written
    exit_code: int
    user_error: str | None = None
    user_traceback: str | None = None
    internal_error: str | None = None
    partial: bool = False


def record_dict(report: RecordReport) -> JsonObject:
    """The report as JSON-ready data; stable key order."""
    calls: list[JsonObject] = [
        {"index": c.index, "device": c.device, "kernel": c.kernel, "file": c.file,
         "line": c.line, "grid": list(c.grid), "fingerprint": c.fingerprint,
         "inputs": len(c.inputs), "outputs": len(c.outputs)} for c in report.calls]
    versions: JsonObject = dict(report.versions)
    return {**header(SCHEMA, SCHEMA_VERSION, report.script), "recording": report.path,
            "bytes": report.size, "chip": report.chip, "versions": versions,
            "exit_code": report.exit_code, "partial": report.partial,
            "user_error": report.user_error, "user_traceback": report.user_traceback,
            "internal_error": report.internal_error, "calls": calls}


def summary_text(report: RecordReport) -> str:
    """`3 pallas_calls recorded on TPU v5 lite in rec.npz (41 kB)`."""
    where = (f"in {report.path} ({report.size / 1024:.1f} kB)" if report.size is not None
             else f"(not written: {report.path})")
    return f"{plural(len(report.calls), 'pallas_call')} recorded on {report.chip} {where}"


def render_table(report: RecordReport, stream: TextIO) -> None:
    console = Console(file=stream, width=140, highlight=False, soft_wrap=False,
                      force_jupyter=False)  # into `stream`, also inside a Jupyter kernel
    if report.calls:
        table = Table(title=f"pallas_calls recorded on {report.chip}", title_justify="left",
                      expand=True)
        for col in ("call", "kernel", "where", "grid", "fingerprint", "operands",
                    "outputs"):
            table.add_column(col, overflow="fold")
        for c in report.calls:
            call = f"{c.index}" + (f" (device {c.device})" if c.device else "")
            table.add_row(call, c.kernel, f"{c.file}:{c.line}", str(c.grid), c.fingerprint,
                          str(len(c.inputs)), str(len(c.outputs)))
        console.print(table)
    print_failures(console, report.user_error, report.user_traceback,
                   report.internal_error)
    summary = summary_text(report)
    if report.partial:
        summary += " (partial: the run did not finish)"
    console.print(Text("pallas-check: ", style="bold") + Text(summary, style="bold"))


class RecordTableReporter:
    def __init__(self, display: Display | None = None) -> None:
        pass  # the table keeps its own width (140 columns), as the timings' does

    def render(self, report: RecordReport, stream: TextIO) -> None:
        render_table(report, stream)


class RecordJsonReporter:
    def __init__(self, display: Display | None = None) -> None:
        pass  # a file's bytes do not depend on where they are shown

    def render(self, report: RecordReport, stream: TextIO) -> None:
        dump(record_dict(report), stream)
