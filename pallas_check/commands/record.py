"""`pallas-check record SCRIPT -o FILE`: each pallas_call's operands and the chip's outputs,
kept in one file (commands/recording.py) that `pallas-check replay` holds the simulation to
on any CPU.

The script runs with every pallas_call on the hardware lowering (Mosaic on a TPU), exactly
as `pallas-check diff --native` runs it: the call's kernel is compiled into the script's own
executable, and beside it one host callback (`intercepted(mode="alongside")`) receives the
call's operands and the chip's outputs, keeps copies of both, and hands the chip's outputs
on: the script sees only what the chip computed, and nothing of ours runs.

A kernel the chip refuses (Mosaic) or that halts it fails the script's executable, so the
callback of that call never runs: the recording keeps every call that returned, and the
script's error (`script_error`, one line) after them. The call that failed is then the
first one not recorded (replay checks that ours reports a finding there).

The recording is written whatever the script did (a failure, Ctrl-C, a stuck call: what was
recorded so far, marked partial when the run was stopped), atomically, to the `-o` target
only; the report (a table, or JSON) goes to stdout.
"""

from __future__ import annotations

import itertools
import threading
from pathlib import Path
from typing import ContextManager, Sequence

import jax
import numpy as np

from pallas_check.commands import recording
from pallas_check.commands.recording import RecordedCall, Recording
from pallas_check.config.errors import one_line
from pallas_check.config.exitcodes import ExitCode, exit_code_for
from pallas_check.config.formats import RECORD, render
from pallas_check.engine.call.describe import kernel_info
from pallas_check.intercept.patched_lowering import intercepted
from pallas_check.jaxbridge.call import describe
from pallas_check.process.execfile import ScriptOutcome
from pallas_check.report.recordings import RecordReport, summary_text
from pallas_check.run import runner
from pallas_check.run.runner import Verdict, script_traceback


def record_unavailable() -> str | None:
    """None when the default JAX backend is a TPU; else the one-line reason (exit 2)."""
    try:
        backend = jax.default_backend()
    except RuntimeError as exc:
        return f"record needs a TPU backend; JAX could not start one ({exc})"
    if backend == "tpu":
        return None
    return (f"record needs a TPU backend; this machine has: {backend}"
            f" (`pallas-check replay` replays a recording on any CPU)")


class Recorder:
    """The handler of `intercepted(..., mode="alongside")`: each call's operands and the
    hardware's outputs kept (copies: the callback's buffers are lent), the hardware's
    outputs handed back to the script."""

    def __init__(self) -> None:
        self.calls: list[RecordedCall] = []
        self.error: str | None = None  # ours: a call we could not keep (exit 4)
        self._seq: dict[int, itertools.count[int]] = {}
        self._lock = threading.Lock()

    def handle_call(self, params: dict, operands: Sequence[np.ndarray], device: int = 0,
                    mesh_axes: tuple = (), native: Sequence[np.ndarray] | None = None
                    ) -> list[np.ndarray]:
        assert native is not None  # mode "alongside" always passes the hardware's outputs
        outputs = [np.array(x) for x in native]
        try:
            kernel = kernel_info(params)
            grid = tuple(int(g) if isinstance(g, (int, np.integer)) else -1
                         for g in describe(params).grid)
            inputs = [np.array(x) for x in operands]
            print_ = recording.fingerprint(params, inputs)
        except Exception as exc:  # noqa: BLE001 - ours: reported, the script goes on
            with self._lock:
                self.error = self.error or one_line(
                    f"recording a call failed: {type(exc).__name__}: {exc}")
            return outputs
        with self._lock:
            index = next(self._seq.setdefault(device, itertools.count()))
            self.calls.append(RecordedCall(index, device, kernel.name,
                                           recording.relative(kernel.file), kernel.line,
                                           grid, print_, inputs, outputs))
        return outputs

    def recorded(self) -> list[RecordedCall]:
        """The calls kept so far, in order (a call's index, then its device)."""
        with self._lock:
            return sorted(self.calls, key=lambda c: (c.index, c.device))


class RecordCommand:
    """`pallas-check record` for runner.run_command: a Recorder installed on the hardware
    lowering while the script runs; the recording written when it ends."""

    def __init__(self, script: str, args: Sequence[str], path: Path) -> None:
        self.script, self.args, self.path = script, list(args), path
        self.recorder = Recorder()

    def installed(self) -> ContextManager[None]:
        return intercepted(self.recorder.handle_call, mode="alongside")

    def calls_in_flight(self) -> int:
        return 0  # nothing is simulated: the watchdog only answers Ctrl-C

    def failed(self) -> bool:
        return self.recorder.error is not None

    def recording(self, outcome: ScriptOutcome) -> Recording:
        device = jax.devices()[0]
        calls = self.recorder.recorded()
        return Recording(script=recording.relative(self.script), args=self.args,
                         chip=str(device.device_kind), platform=str(device.platform),
                         versions=recording.versions(), calls=calls,
                         script_error=None if outcome.ok else one_line(
                             outcome.error or "the script failed"),
                         partial=outcome.interrupted)

    def verdict(self, outcome: ScriptOutcome, ours: list[str], fmt: str,
                to_stdout: bool) -> Verdict:
        made = self.recording(outcome)
        error = self.recorder.error or (one_line(ours[0]) if ours else None)
        size = None
        try:
            recording.write(made, self.path)
            size = self.path.stat().st_size
        except Exception as exc:  # noqa: BLE001 - the file could not be written: exit 4
            error = one_line(f"cannot write the recording {self.path}:"
                             f" {type(exc).__name__}: {exc}")
        user_failed = not outcome.ok and error is None
        code = exit_code_for(0, user_failed, error is not None, calls=len(made.calls))
        report = RecordReport(self.script, str(self.path), made.chip, made.versions,
                              made.calls, size, int(code),
                              outcome.error if user_failed else None,
                              outcome.traceback if user_failed else None, error,
                              outcome.interrupted)
        text = render(report, fmt, RECORD)
        return Verdict(text, code, summary_text(report), error,
                       script_traceback(outcome) if user_failed else None)


def run_record_and_report(script: str, args: Sequence[str], path: Path,
                          fmt: str) -> ExitCode:
    """`pallas-check record`: the script on the chip, every call kept in `path`; the
    report on stdout."""
    return runner.run_command(RecordCommand(script, args, path), script, args, fmt, None)
