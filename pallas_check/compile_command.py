"""`pallas-check compile`: which TPU generations does each pallas_call build for?

The script runs with every pallas_call recorded (its params and operand shapes) and
answered with zeros, nothing simulated; after the script, each call is compiled for each
generation (tpu_compile). The report is a table of calls x generations: ok or the error's
kind, VMEM used of what is available, compile time; each failure is listed with its line.

Zeros are not the call's real outputs: a script that checks its results may fail after its
calls were made. That is said in the report, and does not change the exit code when at
least one call was recorded (the answer is about the calls, which were all made before the
failure); a script that fails before any call is the user's error (exit 3).
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import threading
import time
from typing import Any, Sequence, TextIO

import numpy as np

from pallas_check.config import TpuGeneration
from pallas_check.exitcodes import exit_code_for
from pallas_check.report import render_json_or_table

SCHEMA = "pallas-check/compile-report"
SCHEMA_VERSION = 1


class CompileOnlyCommand:
    """`pallas-check compile` for runner.run_command."""

    def __init__(self, script: str, generations: Sequence[TpuGeneration]) -> None:
        from pallas_check.tpu_compile.stage import CompileRecorder

        self.script = script
        self.generations = tuple(generations)
        self.recorder = CompileRecorder()
        self._counter = itertools.count()
        self._lock = threading.Lock()
        self.started = time.perf_counter()

    def handle_call(self, params: dict, operands: Sequence[np.ndarray], device: int = 0,
                    mesh_axes: tuple = (), call_site: Any = None) -> list[np.ndarray]:
        from pallas_check.engine.call.describe import kernel_info

        if device == 0:  # one record per call, also under shard_map
            with self._lock:
                index = next(self._counter)
            self.recorder.record(index, params, operands, mesh_axes, kernel_info(params),
                                 call_site)
        return [np.zeros(a.shape, a.dtype) for a in params["out_avals"]]

    def installed(self) -> Any:
        import contextlib

        from pallas_check.intercept import intercepted
        from pallas_check.tpu_info import simulated_tpu

        stack = contextlib.ExitStack()
        stack.enter_context(intercepted(self.handle_call, call_sites=True))
        stack.enter_context(simulated_tpu(self.generations[0]))
        self.started = time.perf_counter()
        return stack

    def calls_in_flight(self) -> int:
        return 0

    def failed(self) -> bool:
        return False

    def verdict(self, outcome: Any, ours: list[str], fmt: str, to_stdout: bool) -> Any:
        from pallas_check.report.console import display_for
        from pallas_check.runner import Verdict, one_line, script_traceback
        from pallas_check.tpu_compile.stage import compile_recorded

        script_seconds = time.perf_counter() - self.started
        internal = one_line(ours[0]) if ours else None
        result = None
        if internal is None:
            try:
                result = compile_recorded(self.recorder.calls, self.generations)
            except Exception as exc:  # noqa: BLE001 - ours; one line, exit 4
                internal = one_line(f"compiling failed: {type(exc).__name__}: {exc}")
        calls = sorted(self.recorder.calls, key=lambda c: c.index)
        user_failed = not outcome.ok and not calls and internal is None
        findings = result.findings if result else []
        code = exit_code_for(len(findings), user_failed, internal is not None,
                             calls=len(calls))
        report = CompileReport(
            self.script, [g.value for g in self.generations], script_seconds,
            [_call_row(c, result.by_call.get(c.index, {}) if result else {}) for c in calls],
            findings, int(code), outcome.error if not outcome.ok else None, internal)
        display = display_for(sys.stdout if to_stdout else None)
        text = render_json_or_table(report, fmt, report_dict,
                                    lambda r, stream: render_table(r, stream, display))
        summary = (f"{len(findings)} failure(s) in {len(calls)} pallas_call(s) x"
                   f" {len(self.generations)} generation(s)")
        return Verdict(text, code, summary, internal,
                       script_traceback(outcome) if user_failed else None)


@dataclasses.dataclass
class CompileReport:
    script: str
    generations: list[str]
    script_seconds: float
    calls: list[dict[str, Any]]
    findings: list[Any]
    exit_code: int
    script_error: str | None = None  # how the script ended, when it failed
    internal_error: str | None = None


def _call_row(call: Any, outcomes: dict[str, Any]) -> dict[str, Any]:
    site = call.call_site
    return {"index": call.index, "kernel": call.kernel.name,
            "file": site.file if site else call.kernel.file,
            "line": site.line if site else call.kernel.line,
            "operands": [{"shape": list(shape), "dtype": dtype} for shape, dtype in call.avals],
            "devices": int(np.prod([s for _, s in call.mesh_axes])) if call.mesh_axes else 1,
            "compiled": {g: o.summary() for g, o in outcomes.items()}}


def report_dict(report: CompileReport) -> dict[str, Any]:
    from pallas_check import __version__

    return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION,
            "tool": {"name": "pallas-check", "version": __version__},
            "script": report.script, "generations": report.generations,
            "exit_code": report.exit_code, "script_seconds": report.script_seconds,
            "script_error": report.script_error, "internal_error": report.internal_error,
            "calls": report.calls,
            "findings": [f.to_dict() for f in report.findings]}


def vmem_text(entry: dict[str, Any]) -> str:
    """`3.02 MiB / 16.00 MiB (scratch 1.00 MiB of it)`: the compiler's scoped VMEM use of
    the scoped limit, and how much of it the scratch operands take."""
    from pallas_check.tpu_compile.footprint import format_bytes

    scoped = entry.get("vmem_scoped_bytes")
    if scoped is None:
        return ""
    text = f"{format_bytes(scoped)} / {format_bytes(entry['vmem_scoped_limit_bytes'])}"
    if entry.get("vmem_scratch_bytes"):
        text += f" (scratch {format_bytes(entry['vmem_scratch_bytes'])} of it)"
    return text


def render_table(report: CompileReport, stream: TextIO, display: Any = None) -> None:
    """Calls x generations as a table when every cell fits whole at the display's width,
    else one line per call and generation (`path:line: call N kernel on v5e: ...`)."""
    from rich.table import Table
    from rich.text import Text

    from pallas_check.report.console import Display
    from pallas_check.report.paths import display_path, project_root
    from pallas_check.report.table import fits, print_wrapped, unbroken_column

    console = (display if display is not None else Display()).console(stream)
    root = project_root(report.script)
    title = f"pallas_calls compiled for {', '.join(report.generations)} (libtpu, no TPU)"
    rows = []
    for call in report.calls:
        for generation, entry in call["compiled"].items():
            status = entry["status"] + (f" {entry['error_code']}" if entry["error_code"]
                                        else "")
            rows.append([str(call["index"]), call["kernel"],
                         f"{display_path(call['file'], root)}:{call['line']}", generation,
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


def _print_compile_end(console: Any, report: CompileReport) -> None:
    """The script's stop, our own error and the summary line."""
    from rich.text import Text

    from pallas_check.report.table import print_wrapped

    if report.script_error:
        print_wrapped(console, Text(f"note: the script stopped: {report.script_error} (compile"
                                    " answers every pallas_call with zeros; checks of its"
                                    " results may fail; calls after that point were not"
                                    " compiled)", style="yellow"))
    if report.internal_error:
        print_wrapped(console, Text(f"pallas-check error: {report.internal_error}",
                                    style="red"))
    failures = len(report.findings)
    print_wrapped(console, Text(f"pallas-check: {len(report.calls)} pallas_call(s) compiled"
                                f" for {len(report.generations)} generation(s): {failures}"
                                " failure(s)", style="bold red" if failures else "bold green"))
