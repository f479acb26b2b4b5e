"""The report of `pallas-check run --native`: each pallas_call's wall time on the hardware
lowering, as a table or JSON (versioned schema). native.py measures; this renders."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from pallas_check.report.json import dump, header
from pallas_check.report.table import print_failures
from pallas_check.findings.finding import JsonObject
from pallas_check.findings.units import plural

if TYPE_CHECKING:  # annotations only: a file's bytes do not depend on a display
    from pallas_check.config.display import Display

SCHEMA = "pallas-check/native-timing"
SCHEMA_VERSION = 1


@dataclasses.dataclass
class NativeReport:
    script: str
    backend: str
    script_seconds: float
    calls: list[Any]  # native.CallTiming, one per recorded call
    exit_code: int
    user_error: str | None = None
    user_traceback: str | None = None
    internal_error: str | None = None
    partial: bool = False
    repeats: int = 0  # timed runs of each kernel after its warm-up (native.REPEATS)


def native_dict(report: NativeReport) -> JsonObject:
    """The report as JSON-ready data; stable key order."""
    return {
        **header(SCHEMA, SCHEMA_VERSION, report.script),
        "backend": report.backend,
        "timed": (f"each call's kernel re-run alone after the script on the same operands:"
                  f" compile once, 1 warm-up, best and median of {report.repeats} runs ended"
                  f" by block_until_ready"),
        "script_seconds": report.script_seconds,
        "exit_code": report.exit_code,
        "partial": report.partial,
        "user_error": report.user_error,
        "user_traceback": report.user_traceback,
        "internal_error": report.internal_error,
        "calls": [dataclasses.asdict(c) | {"grid": list(c.grid)} for c in report.calls],
    }


def _ms(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds * 1e3:.3f}"


def render_table(report: NativeReport, stream: TextIO) -> None:
    console = Console(file=stream, width=140, highlight=False, soft_wrap=False,
                      force_jupyter=False)  # into `stream`, also inside a Jupyter kernel
    table = Table(title=f"pallas_call wall times on {report.backend} (native lowering)",
                  title_justify="left", expand=True)
    for col in ("call", "kernel", "where", "grid", "compile ms", "best ms", "median ms",
                "note"):
        table.add_column(col, overflow="fold")
    for c in report.calls:
        table.add_row(str(c.index), c.kernel, f"{c.file}:{c.line}", str(c.grid),
                      _ms(c.compile_s), _ms(c.best_s), _ms(c.median_s), c.not_timed or "")
    console.print(table)
    console.print(Text(f"Timed: each call's kernel re-run alone after the script, on the"
                       f" same operands; best and median of {report.repeats} runs after a"
                       f" warm-up, each ended by block_until_ready.", style="dim"))
    print_failures(console, report.user_error, report.user_traceback,
                   report.internal_error)
    timed = sum(1 for c in report.calls if c.best_s is not None)
    summary = (f"{timed} of {plural(len(report.calls), 'pallas_call')} timed; the script ran"
               f" {report.script_seconds:.3f} s")
    console.print(Text("pallas-check: ", style="bold") + Text(summary, style="bold"))


class NativeTableReporter:
    def __init__(self, display: Display | None = None) -> None:
        pass  # the timings' table keeps its own width (140 columns)

    def render(self, report: NativeReport, stream: TextIO) -> None:
        render_table(report, stream)


class NativeJsonReporter:
    def __init__(self, display: Display | None = None) -> None:
        pass  # a file's bytes do not depend on where they are shown

    def render(self, report: NativeReport, stream: TextIO) -> None:
        dump(native_dict(report), stream)
