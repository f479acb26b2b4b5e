"""`pallas-check replay FILE`: a hardware recording (commands/record.py) held against the
simulation, on any CPU.

Replay is `pallas-check diff` with the recording as the other side (`RecordedSide`): the
recorded script runs again under the simulation, with the run's options, as the chip it
was recorded on (`chip_config`: that generation simulated, each call compiled for it as it
is lowered), and each pallas_call it makes takes the first recorded call not taken yet of
its device and fingerprint, in the chip's order (independent calls of one program may run
in another order on a TPU than on the CPU). Ours simulates that call on the RECORDED
operands, and its outputs are compared with the chip's by diff's rules (per-dtype
tolerances, elements ours never wrote and a PRNG's draws apart). The script gets the chip's
outputs where it handed the call the recorded operands, so that it goes on as it did on
the chip; ours on its own operands where it did not (`RecordedSide.given`).

Agreement, call by call: the outputs match; a call the chip failed at (the recording's
`script_error`: among the calls beyond the recording, the first ours reports a finding
for) is one ours reports a finding for, and a call the chip ran is one ours reports none
for (with `--expect-findings`, a defect's recording, its finding is the verdict). A call
not in the recording, a recorded call the script no longer makes, and a fingerprint that
differs (the kernel changed since it was recorded, or another JAX traced it otherwise) are
disagreements, each said plainly. Exit 0: everything agrees; 1: a disagreement; 2, 3, 4 as
for `diff`.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import sys
import threading
from pathlib import Path
from typing import Sequence

import numpy as np

from pallas_check.commands import recording
from pallas_check.commands.diff import (CallDiff, DiffCommand, DiffReport, NotCompared, Side,
                                        Tolerance)
from pallas_check.commands.recording import RecordedCall, Recording
from pallas_check.config import Config
from pallas_check.config.errors import UsageError, short_error
from pallas_check.config.exitcodes import ExitCode, exit_code_for
from pallas_check.config.display import display_for
from pallas_check.config.formats import DIFF, render
from pallas_check.findings.finding import Finding
from pallas_check.findings.kinds import FindingKind
from pallas_check.findings.units import plural
from pallas_check.intercept.session import Session
from pallas_check.intercept.tpu_info import DEVICE_KINDS
from pallas_check.process.execfile import ScriptOutcome
from pallas_check.report.comparison import summary_text
from pallas_check.run import runner
from pallas_check.run.runner import Verdict, config_dict, script_traceback


class RecordedSide(Side):
    """The chip, as recorded: each call's outputs are the recording's (see the module)."""

    feeds_script = True
    chip = True

    def __init__(self, made: Recording, path: Path, config: Config) -> None:
        self.recording, self.path = made, path
        self.label = f"the chip ({made.chip}, {path.name})"
        # Per (device, fingerprint), the recorded calls no call of ours has taken yet, in
        # the order the chip ran them.
        self._waiting: dict[tuple[int, str], collections.deque[RecordedCall]] = {}
        for c in sorted(made.calls, key=lambda c: (c.device, c.index)):
            self._waiting.setdefault((c.device, c.fingerprint), collections.deque()).append(c)
        self._recorded = collections.Counter(c.device for c in made.calls)
        self.matched: set[tuple[int, int]] = set()  # recorded calls taken: (device, index)
        # Ours with no recorded call taken, and its fingerprint (None: refused by the
        # chip's compile at its lowering, never run)
        self.unmatched: list[tuple[CallDiff, str | None]] = []
        self.chip_failed: set[tuple[int, int]] = set()  # ours the chip's run failed at
        # Ours again, on the script's own operands where they are not the recorded ones
        # (`given`): not reported, not heard.
        self.own = Session(dataclasses.replace(config, check_uninit_outputs=False,
                                               quiet_prints=True, chip_compile=False))
        self._lock = threading.Lock()
        self._now = threading.local()  # the recorded call this thread's call took

    def inputs_for(self, params: dict, operands: Sequence[np.ndarray], device: int,
                   index: int, record: CallDiff) -> Sequence[np.ndarray]:
        """The recorded call this call takes: the first not taken yet, in the chip's order,
        among those of its device and fingerprint (see `settle` for a call none takes)."""
        found = recording.fingerprint(params, operands)
        with self._lock:
            waiting = self._waiting.get((device, found))
            call = waiting.popleft() if waiting else None
            if call is None:
                self.unmatched.append((record, found))
            else:
                self.matched.add((device, call.index))
        self._now.call = call
        if call is None:
            return operands
        if call.index != index:
            record.note = (f"recorded as call {call.index}: the chip ran the calls in"
                           f" another order")
        return call.inputs

    def refused(self, record: CallDiff) -> None:
        with self._lock:
            self.unmatched.append((record, None))

    def outputs(self, params: dict, operands: Sequence[np.ndarray], device: int,
                mesh_axes: tuple, native: Sequence[np.ndarray] | None) -> list[np.ndarray]:
        call: RecordedCall | None = self._now.call
        if call is None:
            raise NotCompared("no recorded call of its fingerprint")  # (said by `settle`)
        return [np.array(x) for x in call.outputs]

    def given(self, params: dict, operands: Sequence[np.ndarray],
              inputs: Sequence[np.ndarray], ours: list[np.ndarray],
              theirs: list[np.ndarray], device: int, mesh_axes: tuple) -> list[np.ndarray]:
        """What the script gets: the chip's outputs where the script handed the call the
        recorded operands, bit for bit. Where it did not (the program computed them on
        this CPU, and the chip's own arithmetic gave other bits: `jax.random.normal`'s
        inverse error function, a transcendental), the chip's outputs are not those of
        the script's operands, and a script checking the call against a reference of its
        own operands would fail where it passed on the chip: it gets ours on its own
        operands, as under `pallas-check run`. (A call over several devices always gets
        the chip's: ours again would need every device to decide alike.)"""
        devices = int(np.prod([size for _, size in mesh_axes])) if mesh_axes else 1
        if devices > 1 or all(_same_bits(a, b) for a, b in zip(operands, inputs)):
            return super().given(params, operands, inputs, ours, theirs, device, mesh_axes)
        return self.own.handle_call(params, operands, device, mesh_axes)

    def config_dict(self) -> dict | None:
        return None

    def settle(self) -> None:
        """After the run, the calls of ours no recorded call matched: paired in order (per
        device) with the recorded calls none of ours took, each is a kernel changed since
        it was recorded; one left over is the call the chip's run failed at (the first
        ours reports a finding for, else the first), or after which it had ended, when the
        recording says it failed; else a call not in the recording."""
        left: dict[int, collections.deque[RecordedCall]] = collections.defaultdict(
            collections.deque)
        for c in sorted(self.recording.calls, key=lambda c: c.index):
            if (c.device, c.index) not in self.matched:
                left[c.device].append(c)
        over: dict[int, list[CallDiff]] = collections.defaultdict(list)
        for record, found in sorted(self.unmatched, key=lambda u: (u[0].device, u[0].index)):
            if found is not None and left[record.device]:
                call = left[record.device].popleft()
                self.matched.add((call.device, call.index))
                record.disagreement = self._other_fingerprint(call, found)
                record.error = "its fingerprint differs from the recorded call's"
            else:
                over[record.device].append(record)
        for device, records in over.items():
            self._left_over(device, records)

    def _left_over(self, device: int, records: list[CallDiff]) -> None:
        """Calls of ours (one device's, in order) beyond what the recording holds."""
        error = self.recording.script_error
        if error is None:
            for record in records:
                record.disagreement = (f"not in the recording (it holds"
                                       f" {plural(self._recorded[device], 'call')} on device"
                                       f" {device})")
                record.error = "not in the recording"
            return
        failed = next((r for r in records if r.findings), records[0])
        self.chip_failed.add((device, failed.index))
        for record in records:
            record.error = (f"the chip's run failed at this call: {error}" if record is failed
                            else f"the chip's run failed (at call {failed.index}) before it"
                                 f" returned this call")

    def _other_fingerprint(self, call: RecordedCall, found: str) -> str:
        recorded_jax = self.recording.versions.get("jax")
        now_jax = recording.versions().get("jax")
        jax_note = (f"; recorded with jax {recorded_jax}, replayed with jax {now_jax}"
                    if recorded_jax != now_jax else "")
        return (f"fingerprint {found} differs from the recorded call's {call.fingerprint}"
                f" ({call.kernel} at {call.file}:{call.line}): the kernel or its shapes"
                f" changed since it was recorded{jax_note}")

    def missing(self) -> list[str]:
        """The recorded calls the script did not make."""
        return [f"call {c.index}{f' (device {c.device})' if c.device else ''} ({c.kernel} at"
                f" {c.file}:{c.line}) is in the recording, but the script did not make it"
                for c in self.recording.calls if (c.device, c.index) not in self.matched]


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays hold the same bits (NaNs alike included)."""
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return (a.shape == b.shape and a.dtype == b.dtype
            and bool(np.array_equal(a.reshape(-1).view(np.uint8),
                                    b.reshape(-1).view(np.uint8))))


class ReplayCommand(DiffCommand):
    """`pallas-check replay` for runner.run_command: diff against a RecordedSide, judged
    by the recording's rules (see the module); `expect_findings`: the recording is of a
    defect (see `_judge_call`)."""

    side: RecordedSide

    def __init__(self, script: str, config: Config, side: RecordedSide, rtol: float | None,
                 atol: float | None, expect_findings: bool = False) -> None:
        super().__init__(script, config, side, rtol, atol)
        self.expect_findings = expect_findings

    def verdict(self, outcome: ScriptOutcome, ours: list[str], fmt: str,
                to_stdout: bool) -> Verdict:
        session = self.session
        error = session.ours.engine_error or (ours[0] if ours else None) or session.side_error
        error = short_error(error) if error else None
        calls = sorted(session.calls, key=lambda c: (c.index, c.device))
        found: dict[int, list[Finding]] = collections.defaultdict(list)
        for finding in session.ours.findings:
            found[finding.call_index].append(finding)
        for call in calls:
            mine = found[call.ours_index] if call.ours_index is not None else []
            call.findings = len(mine)
            call.finding_kinds = sorted({f.kind.value for f in mine})
        self.side.settle()
        for call in calls:
            _judge_call(call, (call.device, call.index) in self.side.chip_failed,
                        found[call.ours_index] if self.expect_findings
                        and call.ours_index is not None else None)
        disagreements = self.side.missing() + self._run_wide(outcome, error)
        user_failed = (not outcome.ok and error is None
                       and self.side.recording.script_error is None)
        problems = (sum(c.mismatches for c in calls) + len(disagreements)
                    + sum(1 for c in calls if c.disagreement))
        code = exit_code_for(problems, user_failed, error is not None, calls=len(calls))
        report = DiffReport(
            script=self.script, against=self.side.label, config=config_dict(self.config),
            against_config=None, rtol=self.rtol, atol=self.atol, calls=calls,
            findings=len(session.ours.findings), exit_code=int(code),
            user_error=outcome.error if user_failed else None,
            user_traceback=outcome.traceback if user_failed else None,
            internal_error=error, partial=outcome.interrupted, disagreements=disagreements,
            recording=_where(self.side))
        text = render(report, fmt, DIFF, display_for(sys.stdout if to_stdout else None))
        return Verdict(text, code, summary_text(report), error,
                       script_traceback(outcome) if user_failed else None)

    def _run_wide(self, outcome: ScriptOutcome, error: str | None) -> list[str]:
        """Disagreements of the run as a whole: the chip's run failed after its last call
        and ours' went on to the end; a defect's recording in which ours found nothing.
        (When the chip's run failed, the script's own failure here is no error of its
        own: nothing after the chip's failure is recorded.)"""
        said = []
        chip_error = self.side.recording.script_error
        if chip_error is not None and not self.side.chip_failed and outcome.ok:
            said.append(f"the chip's run failed after its last call ({chip_error}); ours ran"
                        f" to the end")
        if self.expect_findings and not self.session.ours.findings and error is None:
            said.append("ours reported no finding, and the recording is of a defect"
                        " (--expect-findings)")
        return said


# Findings about values: where one is, the call's outputs hold the defect's values (a
# race's winner, never-written memory, an element out of bounds), which a chip and ours
# need not share. A finding of another kind (a semaphore left signalled, a suppression
# that matched nothing, a compile refusal) explains no output.
_VALUE_KINDS = frozenset({FindingKind.OUT_OF_BOUNDS, FindingKind.UNINITIALIZED,
                          FindingKind.UNWRITTEN_OUTPUT, FindingKind.OUTPUT_REVISITED,
                          FindingKind.DMA_NOT_WAITED, FindingKind.RACE})


def _judge_call(call: CallDiff, chip_failed: bool, expected: list[Finding] | None) -> None:
    """The chip failed at this call <=> ours reports a finding for it. With `expected`
    (`--expect-findings`: ours' findings on the call), a finding where the chip ran
    silently is the defect's verdict, not a disagreement, and the mismatches of an
    output a finding about values explains are counted apart (`_explain`)."""
    found = f"ours reported {plural(call.findings, 'finding')}"
    if chip_failed:
        if call.findings:
            call.note = f"{call.error}; {found} (agree)"
        else:
            call.disagreement = f"{call.error}; ours reported no finding"
        call.error = None
    elif call.findings and call.disagreement is None and call.outputs:
        if expected is None:
            call.disagreement = (f"{found} (`pallas-check run` shows them); the chip ran"
                                 f" it without an error")
            return
        call.note = (f"{found} ({', '.join(call.finding_kinds)}); the chip ran it without"
                     f" an error: the defect (--expect-findings)")
        _explain(call, expected)


def _explain(call: CallDiff, findings: list[Finding]) -> None:
    """Each output's mismatches a finding about values explains, counted apart: one on
    that output, or on memory that is none of the call's outputs (scratch, an input, an
    edge block's padding: what it holds may reach any output)."""
    names = {o.name for o in call.outputs}
    about = [f for f in findings if f.kind in _VALUE_KINDS]
    for o in call.outputs:
        if o.mismatches and not o.drawn and any(f.buffer == o.name or f.buffer not in names
                                                for f in about):
            o.explained, o.mismatches = o.mismatches, 0


def chip_config(made: Recording, config: Config) -> Config:
    """`config` simulating the chip the recording was made on, where it is a TPU
    pallas-check knows (its device kind: `TPU v5 lite` is v5e), whatever `--tpu` says,
    each call compiled for it as it is lowered, as `run` does where libtpu is installed
    (intercept/chip.py: what that chip's compiler refused, ours refuses at the same call);
    else (a recording made on a CPU: tests) `--tpu`'s, and no chip to compile for."""
    for generation, kind in DEVICE_KINDS.items():
        if kind == made.chip:
            return dataclasses.replace(config, tpu=generation.value, chip_compile=True)
    return dataclasses.replace(config, chip_compile=False)


def _where(side: RecordedSide) -> dict:
    made = side.recording
    return {"file": str(side.path), "script": made.script, "chip": made.chip,
            "platform": made.platform, "versions": dict(made.versions),
            "calls": len(made.calls), "script_error": made.script_error}


def load(path: Path) -> Recording:
    """The recording (one line, exit 2, when it is none), and its script found from here."""
    made = recording.read(path)
    if not Path(made.script).is_file():
        raise UsageError(f"{path}: the recorded script {made.script} is not found from"
                         f" {os.getcwd()} (replay runs from the folder it was recorded in)")
    return made


def run_replay_and_report(path: Path, made: Recording, config: Config,
                          tolerance: Tolerance, fmt: str, output: Path | None,
                          expect_findings: bool = False) -> ExitCode:
    """`pallas-check replay`: the recorded script under the simulation, each call held to
    the chip's recorded outputs."""
    side = RecordedSide(made, path, config)
    command = ReplayCommand(made.script, config, side, *tolerance, expect_findings)
    return runner.run_command(command, made.script, made.args, fmt, output)
