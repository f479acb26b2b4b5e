"""`pallas-check compile`: which TPU generations does each pallas_call build for?

The script runs with every pallas_call recorded (its params and operand shapes) and
answered with zeros, nothing simulated, told it runs on the first generation; after the
script, each call is compiled for that generation (tpu_compile). Each further generation
is the script run again in a process of its own, told that chip, its calls compiled for it
(intercept/generations.py: a wrapper's shapes follow the chip it is told). The report is a table of
calls x generations: ok or the error's kind, VMEM used of what is available, compile time;
each failure is listed with its line; and how long each generation's run of the script took.

Zeros are not the call's real outputs: a script that checks its results may fail after its
calls were made. That is said in the report, and does not change the exit code when at
least one call was recorded (the answer is about the calls, which were all made before the
failure); a script that fails before any call is the user's error (exit 3).
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import threading
import time
from typing import Sequence

import numpy as np

from pallas_check.config import TpuGeneration
from pallas_check.engine.call.describe import kernel_info
from pallas_check.jaxbridge.call import output_zeros
from pallas_check.config.errors import one_line
from pallas_check.process.execfile import ScriptOutcome
from pallas_check.config.exitcodes import exit_code_for
from pallas_check.findings.finding import Finding, JsonObject, SourceFrame
from pallas_check.intercept.generations import asked_since, retrace_in_child
from pallas_check.intercept.patched_lowering import intercepted
from pallas_check.report.builds import CallRow, CompileReport, summary_text
from pallas_check.config.display import display_for
from pallas_check.config.formats import COMPILE, render
from pallas_check.run.runner import Verdict, script_traceback
from pallas_check.tpu_compile.compiler import CompileOutcome
from pallas_check.tpu_compile.stage import CompileRecorder, RecordedCall, compile_recorded
from pallas_check.intercept.tpu_info import questions, simulated_tpu


class CompileOnlyCommand:
    """`pallas-check compile` for runner.run_command."""

    def __init__(self, script: str, generations: Sequence[TpuGeneration],
                 args: Sequence[str] = (), devices: int = 1) -> None:
        self.script = script
        self.generations = tuple(generations)
        # Each further generation: the script run again as that chip in a process of its
        # own (intercept/generations.py), with these arguments and device count, unless the script
        # never asked which chip it runs on (tpu_info.questions() since `questions_from`).
        self.args, self.devices = tuple(args), devices
        self.questions_from: int | None = None
        self.recorder = CompileRecorder()
        self._counter = itertools.count()
        self._lock = threading.Lock()
        self.started = time.perf_counter()

    def handle_call(self, params: dict[str, object], operands: Sequence[np.ndarray],
                    device: int = 0, mesh_axes: tuple[tuple[str, int], ...] = (),
                    call_site: SourceFrame | None = None) -> list[np.ndarray]:
        if device == 0:  # one record per call, also under shard_map
            with self._lock:
                index = next(self._counter)
            self.recorder.record(index, params, operands, mesh_axes, kernel_info(params),
                                 call_site)
        return output_zeros(params)

    def installed(self) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        stack.enter_context(intercepted(self.handle_call, call_sites=True))
        stack.enter_context(simulated_tpu(self.generations[0]))
        self.started = time.perf_counter()
        self.questions_from = questions()
        return stack

    def calls_in_flight(self) -> int:
        return 0

    def failed(self) -> bool:
        return False

    def verdict(self, outcome: ScriptOutcome, ours: list[str], fmt: str,
                to_stdout: bool) -> Verdict:
        script_seconds = time.perf_counter() - self.started
        internal = one_line(ours[0]) if ours else None
        calls = sorted(self.recorder.calls, key=lambda c: c.index)
        rows: list[CallRow] = []
        findings: list[Finding] = []
        traces: dict[str, JsonObject] = {}
        if internal is None:
            try:
                rows, findings, traces = self._compiled(calls, script_seconds, outcome)
            except Exception as exc:  # noqa: BLE001 - ours; one line, exit 4
                internal = one_line(f"compiling failed: {type(exc).__name__}: {exc}")
        if internal is not None:
            rows = [call_row(c, {}) for c in calls]
        user_failed = not outcome.ok and not calls and internal is None
        code = exit_code_for(len(findings), user_failed, internal is not None,
                             calls=len(calls))
        report = CompileReport(
            self.script, [g.value for g in self.generations], script_seconds, rows,
            findings, int(code), outcome.error if not outcome.ok else None, internal,
            traces=traces)
        text = render(report, fmt, COMPILE, display_for(sys.stdout if to_stdout else None))
        summary = summary_text(len(calls), len(self.generations), len(findings))
        return Verdict(text, code, summary, internal,
                       script_traceback(outcome) if user_failed else None)

    def _compiled(self, calls: list[RecordedCall], script_seconds: float,
                  outcome: ScriptOutcome
                  ) -> tuple[list[CallRow], list[Finding], dict[str, JsonObject]]:
        """The report's rows and findings: the calls of this run compiled for the first
        generation, each further generation's from a run of the script as that chip."""
        first = self.generations[0].value
        further = self.generations[1:] if asked_since(self.questions_from) else ()
        result = compile_recorded(calls, self.generations[:len(self.generations)
                                                           - len(further)])
        rows = [call_row(c, result.by_call.get(c.index, {})) for c in calls]
        findings = list(result.findings)
        traces: dict[str, JsonObject] = {first: {"own_process": False, "calls": len(calls),
                          "seconds": round(script_seconds, 3),
                          "script_error": None if outcome.ok else outcome.error}}
        for generation in further:
            run = retrace_in_child(self.script, self.args, None, generation, self.devices)
            if run.internal_error is not None:
                raise RuntimeError(f"the script's run as {run.generation}:"
                                   f" {run.internal_error}")
            by_index = {(r.index, r.kernel): r for r in rows}
            for row in run.rows:
                mine = by_index.get((row.index, row.kernel))
                if mine is None:
                    rows.append(row)  # a call only this generation's trace made
                else:
                    mine.compiled.update(row.compiled)
            findings.extend(run.findings)
            traces[generation.value] = run.note()
        rows.sort(key=lambda r: r.index)
        return rows, findings, traces


def call_row(call: RecordedCall, outcomes: dict[str, CompileOutcome]) -> CallRow:
    site = call.call_site
    return CallRow(
        index=call.index, kernel=call.kernel.name,
        file=site.file if site else call.kernel.file,
        line=site.line if site else call.kernel.line,
        operands=[{"shape": list(shape), "dtype": dtype} for shape, dtype in call.avals],
        devices=int(np.prod([s for _, s in call.mesh_axes])) if call.mesh_axes else 1,
        compiled={g: o.summary() for g, o in outcomes.items()})
