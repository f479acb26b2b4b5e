"""`--native`: the real hardware lowering (Mosaic on a TPU, Triton / Mosaic GPU on a GPU).

`pallas-check run --native` runs the script with every pallas_call going to the hardware
lowering; nothing of ours replaces any value. What is timed, and how:

- while the script runs, the hardware kernel of each call is in the script's own
  executable, untouched; next to it, one host callback copies the call's operands to the
  host (the only thing added; it is why the script's own wall time is a little longer);
- after the script ends, each recorded call's kernel is run again on its own, on the same
  operands moved back to the device: compiled once (the compile time is reported), run once
  to warm up, then `REPEATS` times, each run ended by `block_until_ready`; the report gives
  the best and the median of those runs (so: the kernel alone, with dispatch, not the
  surrounding XLA program, and not the host copies).

A kernel running inside a `shard_map` over several devices is not re-run alone (a single
device's part of a call that communicates could wait forever); it is listed as not timed.
Where no TPU or GPU backend exists, `native_unavailable()` names what there is and the CLI
stops with exit 2 before running anything.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
import threading
import time
from pathlib import Path
from typing import Any, Sequence

import jax
import numpy as np

from pallas_check.run import runner
from pallas_check.engine.call.describe import kernel_info
from pallas_check.config.errors import one_line
from pallas_check.config.exitcodes import ExitCode, exit_code_for
from pallas_check.intercept.patched_lowering import intercepted, native_function
from pallas_check.jaxbridge.call import describe
from pallas_check.config.formats import NATIVE, render
from pallas_check.report.timings import NativeReport
from pallas_check.run.runner import Verdict, script_traceback
from pallas_check.findings.units import plural

ACCELERATORS = ("tpu", "gpu", "cuda", "rocm")
REPEATS = 5
MAX_TIMED_CALLS = 256  # calls beyond these are counted, not kept (their operands cost memory)


def platforms() -> list[str]:
    """The JAX platforms that have devices in this process (e.g. ['cpu'])."""
    found = []
    for name in ("tpu", "gpu", "cpu"):
        try:
            if jax.devices(name):
                found.append(name)
        except RuntimeError:
            pass
    return found


def native_unavailable() -> str | None:
    """None when the default JAX backend is a TPU or GPU; else the one-line reason."""
    try:
        backend = jax.default_backend()
    except RuntimeError as exc:
        return f"--native needs a TPU or GPU backend; JAX could not start one ({exc})"
    if backend in ACCELERATORS:
        return None
    return ("--native needs a TPU or GPU backend; this machine has: "
            + (", ".join(platforms()) or backend)
            + " (--compile, or `pallas-check compile`, checks that kernels build for a TPU"
              " without one)")


@dataclasses.dataclass
class RecordedCall:
    index: int
    params: dict
    operands: list[np.ndarray] | None  # None: not kept (beyond MAX_TIMED_CALLS)
    device: int
    devices: int


@dataclasses.dataclass
class CallTiming:
    index: int
    kernel: str
    file: str
    line: int
    grid: tuple[int, ...]
    compile_s: float | None = None
    best_s: float | None = None
    median_s: float | None = None
    runs: int = 0
    not_timed: str | None = None  # why, when the call was not timed


class NativeRecorder:
    """The observer behind `intercepted(..., mode="observe")`: keeps each call's operands."""

    def __init__(self) -> None:
        self.calls: list[RecordedCall] = []
        self._counter = itertools.count()
        self._lock = threading.Lock()

    def observe(self, params: dict, operands: Sequence[np.ndarray], device: int = 0,
                mesh_axes: tuple = ()) -> None:
        devices = int(np.prod([size for _, size in mesh_axes])) if mesh_axes else 1
        with self._lock:
            index = next(self._counter)
            keep = index < MAX_TIMED_CALLS and devices == 1
            self.calls.append(RecordedCall(index, params,
                                           [np.array(x) for x in operands] if keep else None,
                                           device, devices))


def time_calls(calls: Sequence[RecordedCall], repeats: int = REPEATS) -> list[CallTiming]:
    """Re-run each recorded call's hardware kernel alone (no interception installed)."""
    compiled: dict[tuple, tuple[Any, float]] = {}
    out = []
    for call in sorted(calls, key=lambda c: c.index):
        kernel = kernel_info(call.params)
        grid = tuple(int(g) if isinstance(g, (int, np.integer)) else -1
                     for g in describe(call.params).grid)
        timing = CallTiming(call.index, kernel.name, kernel.file, kernel.line, grid)
        out.append(timing)
        if call.devices > 1:
            timing.not_timed = (f"part of a {call.devices}-device call (shard_map): one"
                                f" device's kernel is not re-run alone")
            continue
        if call.operands is None:
            timing.not_timed = f"beyond the first {MAX_TIMED_CALLS} calls"
            continue
        try:
            args = [jax.device_put(x) for x in call.operands]
            key = (id(call.params), tuple((a.shape, str(a.dtype)) for a in call.operands))
            if key not in compiled:
                started = time.perf_counter()
                executable = native_function(call.params).lower(*args).compile()
                compiled[key] = (executable, time.perf_counter() - started)
            executable, timing.compile_s = compiled[key]
            jax.block_until_ready(executable(*args))  # warm-up
            seconds = []
            for _ in range(repeats):
                started = time.perf_counter()
                jax.block_until_ready(executable(*args))
                seconds.append(time.perf_counter() - started)
            timing.best_s, timing.median_s = min(seconds), statistics.median(seconds)
            timing.runs = len(seconds)
        except Exception as exc:  # reported per call; the other calls are still timed
            timing.not_timed = one_line(f"{type(exc).__name__}: {exc}")[:300]
    return out


def run_native_and_report(script: str, args: Sequence[str], fmt: str,
                          output: Path | None) -> ExitCode:
    """`pallas-check run --native`: the script on the hardware lowering, each call timed."""
    return runner.run_command(NativeCommand(script), script, args, fmt, output)


class NativeCommand:
    """`run --native` for runner.run_command: the calls are only observed while the script
    runs; afterwards each is re-run alone on the hardware and timed."""

    def __init__(self, script: str) -> None:
        self.script = script
        self.recorder = NativeRecorder()
        self.started = time.perf_counter()

    def installed(self) -> Any:
        self.started = time.perf_counter()
        # mode "observe" never uses what the handler returns (it returns nothing)
        return intercepted(self.recorder.observe, mode="observe")  # type: ignore[arg-type]

    def calls_in_flight(self) -> int:
        return 0  # nothing is simulated: the watchdog only answers Ctrl-C

    def failed(self) -> bool:
        return False

    def verdict(self, outcome: Any, ours: list[str], fmt: str, to_stdout: bool) -> Any:
        script_seconds = time.perf_counter() - self.started
        internal = None
        timings: list = []
        if not outcome.interrupted:  # a stuck or interrupted run is not re-run to be timed
            try:
                timings = time_calls(self.recorder.calls)
            except Exception as exc:  # noqa: BLE001 - ours; one line, exit 4
                internal = one_line(f"timing failed: {type(exc).__name__}: {exc}")
        if ours and internal is None:
            internal = one_line(ours[0])
        user_failed = not outcome.ok and internal is None
        code = exit_code_for(0, user_failed, internal is not None,
                             calls=len(self.recorder.calls))
        report = NativeReport(self.script, jax.default_backend(), script_seconds, timings,
                              int(code), outcome.error if user_failed else None,
                              outcome.traceback if user_failed else None, internal,
                              outcome.interrupted, repeats=REPEATS)
        text = render(report, fmt, NATIVE)
        return Verdict(text, code, f"{plural(len(timings), 'pallas_call')} timed", internal,
                       script_traceback(outcome) if user_failed else None)
