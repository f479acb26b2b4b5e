"""The report of `pallas-check compile`: calls x TPU generations, as a table or JSON
(versioned schema). commands/compile.py compiles; this renders."""

from __future__ import annotations

import dataclasses
from typing import Mapping, TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from pallas_check.findings.finding import Finding, JsonObject, JsonValue
from pallas_check.config.display import Display
from pallas_check.report.json import dump, header
from pallas_check.report.paths import display_path, project_root
from pallas_check.report.table import fits, print_wrapped, unbroken_column
from pallas_check.findings.units import format_bytes, plural

SCHEMA = "pallas-check/compile-report"
SCHEMA_VERSION = 1


@dataclasses.dataclass
class CallRow:
    """One call of the report: where it is, its operands, and per generation what the
    compiler said of it (tpu_compile's `CompileOutcome.summary()`)."""

    index: int
    kernel: str
    file: str
    line: int
    operands: list[JsonObject]  # each: its shape and dtype
    devices: int
    compiled: dict[str, JsonObject]  # generation -> the compiler's summary

    def to_dict(self) -> JsonObject:
        return {"index": self.index, "kernel": self.kernel, "file": self.file,
                "line": self.line, "operands": self.operands, "devices": self.devices,
                "compiled": self.compiled}


@dataclasses.dataclass
class CompileReport:
    script: str
    generations: list[str]
    script_seconds: float
    calls: list[CallRow]
    findings: list[Finding]
    exit_code: int
    script_error: str | None = None  # how the script ended, when it failed
    internal_error: str | None = None
    # Per generation, its run of the script (intercept/generations.py): in this process or one of
    # its own, calls, the script's error, seconds.
    traces: dict[str, JsonObject] = dataclasses.field(default_factory=dict)


def compile_dict(report: CompileReport) -> JsonObject:
    """The report as JSON-ready data; stable key order."""
    return {**header(SCHEMA, SCHEMA_VERSION, report.script),
            "generations": report.generations,
            "exit_code": report.exit_code, "script_seconds": report.script_seconds,
            "script_error": report.script_error, "internal_error": report.internal_error,
            "calls": [call.to_dict() for call in report.calls],
            "findings": [f.to_dict() for f in report.findings],
            "traces": report.traces}


def vmem_text(entry: Mapping[str, JsonValue]) -> str:
    """`3.02 MiB / 16.00 MiB (scratch 1.00 MiB of it)`: the compiler's scoped VMEM use of
    the scoped limit, and how much of it the scratch operands take."""
    scoped, limit = entry.get("vmem_scoped_bytes"), entry.get("vmem_scoped_limit_bytes")
    if not isinstance(scoped, int) or not isinstance(limit, int):
        return ""  # (the compiler said nothing of VMEM: it failed before)
    text = f"{format_bytes(scoped)} / {format_bytes(limit)}"
    scratch = entry.get("vmem_scratch_bytes")
    if isinstance(scratch, int) and scratch:
        text += f" (scratch {format_bytes(scratch)} of it)"
    return text


def render_table(report: CompileReport, stream: TextIO,
                 display: Display | None = None) -> None:
    """Calls x generations as a table when every cell fits whole at the display's width,
    else one line per call and generation (`path:line: call N kernel on v5e: ...`)."""
    console = (display if display is not None else Display()).console(stream)
    root = project_root(report.script)
    title = f"pallas_calls compiled for {', '.join(report.generations)} (libtpu, no TPU)"
    rows = []
    for call in report.calls:
        for generation, entry in call.compiled.items():
            status = f"{entry['status']}" + (f" {entry['error_code']}" if entry["error_code"]
                                        else "")
            rows.append([str(call.index), call.kernel,
                         f"{display_path(call.file, root)}:{call.line}", generation,
                         status, vmem_text(entry), f"{entry['compile_seconds']:.2f}"])
    table = Table(title=title, title_justify="left")
    for col, header in enumerate(("call", "kernel", "where", "tpu", "result",
                                  "VMEM scoped / limit", "compile s")):
        unbroken_column(table, console, header, [Text(r[col]) for r in rows])
    for row in rows:
        table.add_row(*row)
    if fits(console, table):
        console.print(table)
    else:
        console.print(Text(title, style="bold underline"))
        for index, kernel, where, generation, status, vmem, seconds in rows:
            print_wrapped(console, Text(where, style="cyan") + Text(
                f": call {index} {kernel} on {generation}: {status}"
                + (f", VMEM {vmem}" if vmem else "") + f", compiled in {seconds} s"))
    for f in report.findings:
        where = (f"{display_path(f.location.file, root)}:{f.location.line}" if f.location
                 else "?")
        print_wrapped(console, Text(f"{where}: {f.kind.value}: {f.kernel.name}"
                                    + (f" [{f.buffer}]" if f.buffer else "")
                                    + f": {' '.join(f.message.split())} (call {f.call_index})"))
    _print_compile_end(console, report)


def _print_compile_end(console: Console, report: CompileReport) -> None:
    """The script's stop, our own error and the summary line."""
    if report.script_error:
        print_wrapped(console, Text(f"note: the script stopped: {report.script_error} (compile"
                                    " answers every pallas_call with zeros; checks of its"
                                    " results may fail; calls after that point were not"
                                    " compiled)", style="yellow"))
    if len(report.traces) > 1:
        print_wrapped(console, Text(f"note: {traces_text(report.traces)}", style="yellow"))
    if report.internal_error:
        print_wrapped(console, Text(f"pallas-check error: {report.internal_error}",
                                    style="red"))
    failures = len(report.findings)
    print_wrapped(console, Text("pallas-check: " + summary_text(
        len(report.calls), len(report.generations), failures),
        style="bold red" if failures else "bold green"))


def summary_text(calls: int, generations: int, failures: int) -> str:
    """`2 pallas_calls compiled for 1 generation: 0 failures`: the report's summary line,
    and the stderr line when the report went to a file."""
    return (f"{plural(calls, 'pallas_call')} compiled for {plural(generations, 'generation')}:"
            f" {plural(failures, 'failure')}")


def traces_text(traces: dict[str, JsonObject]) -> str:
    """`each generation traced by a run of the script as that chip: v6e in this process
    (script 0.56 s), v7x in a process of its own (script 0.61 s; 5.10 s with its start and
    compiles)`, and where the script stopped."""
    parts = []
    for generation, trace in traces.items():
        where = "a process of its own" if trace.get("own_process") else "this process"
        text = f"{generation} in {where} (script {trace.get('seconds', 0.0):.2f} s"
        if trace.get("own_process"):
            text += f"; {trace.get('process_seconds', 0.0):.2f} s with its start and compiles"
        if trace.get("script_error"):
            text += f"; the script stopped: {trace['script_error']}"
        parts.append(text + ")")
    return "each generation traced by a run of the script as that chip: " + ", ".join(parts)


class CompileTableReporter:
    def __init__(self, display: Display | None = None) -> None:
        self.display = display

    def render(self, report: CompileReport, stream: TextIO) -> None:
        render_table(report, stream, self.display)


class CompileJsonReporter:
    def __init__(self, display: Display | None = None) -> None:
        pass  # a file's bytes do not depend on where they are shown

    def render(self, report: CompileReport, stream: TextIO) -> None:
        dump(compile_dict(report), stream)
