"""`pallas-check diff`: every pallas_call run twice, outputs compared call by call.

One side is always ours (the engine with the run's Config; its outputs are what the script
gets, so the script goes on exactly as under `pallas-check run`). The other side, in the
same host callback and on the same operands, is one of:

- `native`   the hardware lowering (Mosaic on a TPU, Triton / Mosaic GPU on a GPU). It
             is compiled into the script's own executable next to the callback, which
             receives the hardware's outputs (see `intercept._make_native_lowering`);
- `hlo`      JAX's HLO interpreter (`pallas_call(..., interpret=True)`);
- `jax-interpret`  JAX's TPU interpreter (`InterpretParams()`, with our uninitialized
             fill and DMA mode so that a difference is one of the interpreters);
- another configuration of ours, given as options: `--against "--uninit zero"`.

(The sides beside the hardware, and `--against`'s parsing: commands/sides.py.)
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import itertools
import sys
import threading
from pathlib import Path
from typing import Callable, ContextManager, Iterator, NamedTuple, Sequence

import jax
import numpy as np

from pallas_check.jaxbridge.call import describe
from pallas_check.run import runner
from pallas_check.config import Config
from pallas_check.engine.call.describe import kernel_arg_names, kernel_info
from pallas_check.engine.runtime.backend import engine_device
from pallas_check.config.errors import one_line, short_error
from pallas_check.process.execfile import ScriptOutcome
from pallas_check.config.exitcodes import ExitCode, exit_code_for
from pallas_check.findings.finding import Finding, KernelInfo, SourceFrame
from pallas_check.intercept import empties, outer
from pallas_check.intercept.patched_lowering import intercepted
from pallas_check.engine.call.exposures import differs
from pallas_check.findings.output_diff import OutputDiff, compare, compare_drawn
from pallas_check.config.display import display_for
from pallas_check.report.comparison import summary_text
from pallas_check.config.formats import DIFF, render
from pallas_check.run.runner import Verdict, config_dict, script_traceback
from pallas_check.intercept.chip import ChipCheck
from pallas_check.intercept.session import Session
from pallas_check.intercept.tpu_info import simulated_tpu
from pallas_check.jaxbridge.chip_arithmetic import chip_arithmetic
from pallas_check.findings.units import plural


# ---------------------------------------------------------------- the other side


class NotCompared(Exception):
    """A call the other side has no outputs for, by design (a recording without it): the
    call is listed as not compared, with this message; not a failure of the side."""


class Side:
    label = "?"
    native = False
    chip = False  # its outputs are a chip's: compared within the chip's own noise
    # Whether the script gets this side's outputs (a recording: the script goes on as it
    # did on the chip) instead of ours.
    feeds_script = False
    # Its PRNG bits are ours (another configuration of ours): outputs of a call that drew
    # from a core's hardware PRNG are compared; against anything else they are not.
    same_prng = False

    def inputs_for(self, params: dict, operands: Sequence[np.ndarray], device: int,
                   index: int, record: CallDiff) -> Sequence[np.ndarray]:
        """The operands both sides run this call on (the script's, but for a recording:
        the recorded ones); may note on `record` what it knows of the call."""
        return operands

    def refused(self, record: CallDiff) -> None:
        """A call the chip's compile refused at its lowering (listed, never run)."""

    def outputs(self, params: dict, operands: Sequence[np.ndarray], device: int,
                mesh_axes: tuple, native: Sequence[np.ndarray] | None) -> list[np.ndarray]:
        raise NotImplementedError

    def given(self, params: dict, operands: Sequence[np.ndarray],
              inputs: Sequence[np.ndarray], ours: list[np.ndarray],
              theirs: list[np.ndarray], device: int, mesh_axes: tuple) -> list[np.ndarray]:
        """What the script gets from a side that feeds it: its outputs, as ours' types."""
        return [np.asarray(t, dtype=o.dtype).reshape(o.shape) for o, t in zip(ours, theirs)]

    def config_dict(self) -> dict | None:
        return None


class NativeSide(Side):
    label = "native"
    native = True
    chip = True

    def outputs(self, params, operands, device, mesh_axes, native):
        assert native is not None
        return [np.asarray(x) for x in native]


# ---------------------------------------------------------------- the session


@dataclasses.dataclass
class CallDiff:
    index: int
    device: int
    kernel: str
    file: str
    line: int
    grid: tuple[int, ...]
    outputs: list[OutputDiff]
    error: str | None = None  # the other side could not run this call
    # `replay`: why this call disagrees with the recording beyond its outputs (a call the
    # recording does not have, another fingerprint, the chip failed and ours found nothing)
    disagreement: str | None = None
    note: str | None = None  # what else is known of the call (the chip failed here, ...)
    ours_index: int | None = None  # the call's index in our session (its findings)
    findings: int = 0  # what our session reported for this call (set with the report)
    finding_kinds: list[str] = dataclasses.field(default_factory=list)  # (replay's) their kinds

    @property
    def mismatches(self) -> int:
        return sum(o.mismatches for o in self.outputs)


def _output_names(params: dict) -> list[str]:
    call = describe(params)
    n_out = len(call.out_avals)
    try:
        names = kernel_arg_names(call.kernel)
        start = call.num_scalars + call.num_inputs
        return [names[start + j] for j in range(n_out)]
    except Exception:  # noqa: BLE001 - names are a nicety
        return [f"out{j}" for j in range(n_out)]


@contextlib.contextmanager
def _on_cpu() -> Iterator[None]:
    """Our engine and JAX's interpreters run on the engine's own CPU client (whatever the
    default device is): computations started from inside a callback must not wait for the
    runtime that waits for the callback."""
    with jax.default_device(engine_device()):
        yield


def _digest(arrays: Sequence[np.ndarray]) -> bytes:
    digest = hashlib.sha1()
    for x in arrays:
        digest.update(np.ascontiguousarray(x).view(np.uint8).ravel().tobytes())
    return digest.digest()


class DiffSession:
    """The interception handler of `pallas-check diff`: ours, then the other side.

    Ours is a whole `Session` with `run`'s judge (intercept/judge.py): a finding about
    output elements is dropped when the jitted program around the call does not keep them,
    as `run` decides, by re-running that program. A re-run's calls are the first run's
    again: ours only, not compared twice, each given what the first run gave the script
    (a side that feeds the script, the recording, with what ours changed in the re-run)."""

    def __init__(self, config: Config, side: Side, rtol: float | None = None,
                 atol: float | None = None) -> None:
        self.config = config
        self.side = side
        self.rtol, self.atol = rtol, atol
        self.ours = Session(config)
        self.calls: list[CallDiff] = []
        self.side_error: str | None = None
        self._seq: dict[int, itertools.count] = {}
        self._lock = threading.Lock()
        # The chip's compile at each call's lowering, where the config asks for it
        # (`replay`: intercept/chip.py); a call it refuses is listed here too.
        self.ours.chip = ChipCheck(config, self._refused)
        # A side that feeds the script: per call (params, device, operands' digest), the
        # operands ours ran on, ours' outputs and what the script got (for a re-run).
        self._fed: dict[tuple[int, int, bytes], tuple[Sequence[np.ndarray],
                                                      list[np.ndarray],
                                                      list[np.ndarray]]] = {}

    def handle_call(self, params: dict, operands: Sequence[np.ndarray], device: int = 0,
                    mesh_axes: tuple = (), native: Sequence[np.ndarray] | None = None,
                    call_site: SourceFrame | None = None) -> list[np.ndarray]:
        with _on_cpu():
            if self.ours.judge.replaying():
                return self._again(params, operands, device, mesh_axes, call_site)
            with self._lock:
                index = next(self._seq.setdefault(device, itertools.count()))
            kernel = kernel_info(params)
            grid = tuple(int(g) if isinstance(g, (int, np.integer)) else -1
                         for g in describe(params).grid)
            record = CallDiff(index, device, kernel.name, kernel.file, kernel.line, grid, [])
            inputs = self.side.inputs_for(params, operands, device, index, record)
            if inputs is not operands:  # what the script made with `jnp.empty`, still so
                empties.stand_in(params, operands, inputs)
            ours = self.ours.handle_call(params, inputs, device, mesh_axes,
                                         call_site=call_site)
            last = self.ours.last_call()
            never = last.never_written if last is not None else {}
            record.ours_index = last.index if last is not None else None
            drawn = last is not None and last.drew_random and not self.side.same_prng
            theirs = self._theirs(params, inputs, device, mesh_axes, native, record)
            if theirs is not None:
                names = _output_names(params)
                at = device if mesh_axes else 0
                record.outputs = [compare_drawn(o, t, (j, names[j])) if drawn
                                  else compare(o, t, self.rtol, self.atol, (j, names[j]),
                                               never.get((at, j)), chip=self.side.chip)
                                  for j, (o, t) in enumerate(zip(ours, theirs))]
                if len(theirs) != len(ours):
                    record.error = (f"{self.side.label} returned"
                                    f" {plural(len(theirs), 'output')},"
                                    f" ours {len(ours)}")
            with self._lock:
                self.calls.append(record)
            if not self.side.feeds_script or theirs is None or len(theirs) != len(ours):
                return ours
            given = self.side.given(params, operands, inputs, ours, theirs, device, mesh_axes)
            with self._lock:
                self._fed[(id(params), device, _digest(operands))] = (inputs, ours, given)
            return given

    def _refused(self, params: dict, kernel: KernelInfo, call_site: SourceFrame | None,
                 mesh_axes: tuple, finding: Callable[[int], Finding]) -> int:
        """A call the chip's compile refused as it was lowered: ours' (its finding), and
        listed here, not compared (nothing ran: the program raised the chip's error)."""
        index = self.ours.refused_by_chip(params, kernel, call_site, mesh_axes, finding)
        with self._lock:
            seq = next(self._seq.setdefault(0, itertools.count()))
        grid = tuple(int(g) if isinstance(g, (int, np.integer)) else -1
                     for g in describe(params).grid)
        record = CallDiff(seq, 0, kernel.name, kernel.file, kernel.line, grid, [],
                          error=f"not run: {self.ours.chip.generation.value}'s compiler"
                                f" refuses it", ours_index=index)
        self.side.refused(record)
        with self._lock:
            self.calls.append(record)
        return index

    def _theirs(self, params: dict, inputs: Sequence[np.ndarray], device: int,
                mesh_axes: tuple, native: Sequence[np.ndarray] | None,
                record: CallDiff) -> list[np.ndarray] | None:
        """The other side's outputs, or None (and why, in `record.error`)."""
        try:
            return self.side.outputs(params, inputs, device, mesh_axes, native)
        except Exception as exc:  # noqa: BLE001 - reported; the script goes on
            record.error = one_line(f"{type(exc).__name__}: {exc}")[:500]
            if isinstance(exc, NotCompared):
                record.error = str(exc)
                return None
            with self._lock:
                if self.side_error is None:
                    self.side_error = (f"{self.side.label} could not run call"
                                       f" {record.index} ({record.kernel}): {record.error}")
            return None

    def _again(self, params: dict, operands: Sequence[np.ndarray], device: int,
               mesh_axes: tuple, call_site: SourceFrame | None) -> list[np.ndarray]:
        """A call of a program the judge re-runs: ours again, on the operands it first ran
        on; where the first run gave the script the side's outputs, those again, but for
        the elements the re-run changed (the judge's other values): there a value other
        than the script got, ours' other value, or ours' first where the side's was that
        other value already (a chip's unwritten memory often holds 0, one of our fills)."""
        with self._lock:
            kept = self._fed.get((id(params), device, _digest(operands)))
        inputs = kept[0] if kept is not None else operands
        again = self.ours.handle_call(params, inputs, device, mesh_axes, call_site=call_site)
        if kept is None:
            return again
        return [np.where(differs(a, o), np.where(differs(a, g), a, o), g)
                for a, o, g in zip(again, kept[1], kept[2])]

    @contextlib.contextmanager
    def install(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            if self.side.native:  # kernels asking which chip they run on get the real one
                stack.enter_context(intercepted(self.handle_call, mode="alongside"))
            else:
                stack.enter_context(intercepted(
                    self.handle_call, call_sites=True,
                    chip=self.ours.chip.check if self.ours.chip.on else None))
                stack.enter_context(simulated_tpu(self.config.tpu, self.config.cores))
            # ours on the CPU rounds products and computes exp, division, ... as the chip
            # does, bit for bit (the native side's program runs on the chip)
            stack.enter_context(chip_arithmetic(self.config.chip_arithmetic, functions=True))
            outer.install(self.ours.judge)  # `run`'s judge of unwritten outputs
            empties.install()
            try:
                yield
            finally:
                empties.uninstall()
                outer.uninstall()


# ---------------------------------------------------------------- the run and its report


@dataclasses.dataclass
class DiffReport:
    script: str
    against: str
    config: dict
    against_config: dict | None
    rtol: float | None
    atol: float | None
    calls: list[CallDiff]
    findings: int
    exit_code: int
    user_error: str | None = None
    user_traceback: str | None = None
    internal_error: str | None = None
    partial: bool = False
    disagreements: list[str] = dataclasses.field(default_factory=list)  # replay's
    recording: dict | None = None  # replay: where the recording was made

    @property
    def mismatching_outputs(self) -> int:
        return sum(1 for c in self.calls for o in c.outputs if o.mismatches)


class Tolerance(NamedTuple):
    """How far apart two outputs' elements may be and still agree (numpy's `isclose`;
    None: findings/output_diff.py's default for the dtype)."""

    rtol: float | None = None
    atol: float | None = None


def run_diff_and_report(script: str, args: Sequence[str], config: Config, side: Side,
                        tolerance: Tolerance, fmt: str, output: Path | None) -> ExitCode:
    """`pallas-check diff`: every call run by ours and by `side`, outputs compared."""
    return runner.run_command(DiffCommand(script, config, side, *tolerance), script, args,
                              fmt, output)


class DiffCommand:
    """`pallas-check diff` for runner.run_command: a DiffSession installed while the script
    runs; the report compares the outputs call by call."""

    def __init__(self, script: str, config: Config, side: Side, rtol: float | None,
                 atol: float | None) -> None:
        self.script, self.config, self.side = script, config, side
        self.rtol, self.atol = rtol, atol
        self.session = DiffSession(config, side, rtol, atol)

    def installed(self) -> ContextManager[None]:
        return self.session.install()

    def calls_in_flight(self) -> int:
        return self.session.ours.calls_in_flight

    def failed(self) -> bool:
        return self.session.ours.engine_error is not None or self.session.side_error is not None

    def verdict(self, outcome: ScriptOutcome, ours: list[str], fmt: str,
                to_stdout: bool) -> Verdict:
        session = self.session
        error = session.ours.engine_error or (ours[0] if ours else None) or session.side_error
        error = short_error(error) if error else None
        user_failed = not outcome.ok and error is None
        calls = sorted(session.calls, key=lambda c: (c.index, c.device))
        by_call = collections.Counter(f.call_index for f in session.ours.findings)
        for call in calls:
            call.findings = by_call[call.ours_index] if call.ours_index is not None else 0
        code = exit_code_for(sum(c.mismatches for c in calls), user_failed, error is not None,
                             calls=len(calls))
        report = DiffReport(
            script=self.script, against=self.side.label, config=config_dict(self.config),
            against_config=self.side.config_dict(), rtol=self.rtol, atol=self.atol,
            calls=calls, findings=len(session.ours.findings), exit_code=int(code),
            user_error=outcome.error if user_failed else None,
            user_traceback=outcome.traceback if user_failed else None,
            internal_error=error, partial=outcome.interrupted)
        text = render(report, fmt, DIFF, display_for(sys.stdout if to_stdout else None))
        return Verdict(text, code, summary_text(report), error,
                       script_traceback(outcome) if user_failed else None)
