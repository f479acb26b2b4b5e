"""`pallas-check replay FILE`: a hardware recording (commands/record.py) held against the
simulation, on any CPU.

Replay is `pallas-check diff` with the recording as the other side (`RecordedSide`): the
recorded script runs again under the simulation, with the run's options (`--tpu v5e` by
default), and each pallas_call it makes is matched to the recorded call of the same index
(per device) and fingerprint. Ours simulates that call on the RECORDED operands, and its
outputs are compared with the chip's by diff's rules (per-dtype tolerances, elements ours
never wrote counted apart). The script gets the chip's outputs, so it goes on exactly as it
did on the chip (its later calls see the operands the chip's run saw).

Agreement, call by call: the outputs match; a call the chip failed at (the recording's
`script_error`, at the first call not recorded) is one ours reports a finding for, and a
call the chip ran is one ours reports none for. A call not in the recording, a recorded
call the script no longer makes, and a fingerprint that differs (the kernel changed since
it was recorded, or another JAX traced it otherwise) are disagreements, each said plainly.
Exit 0: everything agrees; 1: a disagreement; 2, 3, 4 as for `diff`.
"""

from __future__ import annotations

import collections
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
from pallas_check.findings.units import plural
from pallas_check.process.execfile import ScriptOutcome
from pallas_check.report.comparison import summary_text
from pallas_check.run import runner
from pallas_check.run.runner import Verdict, config_dict, script_traceback


class RecordedSide(Side):
    """The chip, as recorded: each call's outputs are the recording's (see the module)."""

    feeds_script = True
    chip = True

    def __init__(self, made: Recording, path: Path) -> None:
        self.recording, self.path = made, path
        self.label = f"the chip ({made.chip}, {path.name})"
        self._by_call = {(c.device, c.index): c for c in made.calls}
        self._recorded = collections.Counter(c.device for c in made.calls)
        self.matched: set[tuple[int, int]] = set()
        self.chip_failed: set[tuple[int, int]] = set()  # the call the chip's run failed at
        self._lock = threading.Lock()
        self._now = threading.local()  # the call this thread is comparing: matched or why not

    def inputs_for(self, params: dict, operands: Sequence[np.ndarray], device: int,
                   index: int, record: CallDiff) -> Sequence[np.ndarray]:
        self._now.call, self._now.why = None, ""
        call = self._by_call.get((device, index))
        if call is None:
            self._now.why = self._absent(device, index, record)
            return operands
        with self._lock:
            self.matched.add((device, index))
        found = recording.fingerprint(params, operands)
        if found != call.fingerprint:
            record.disagreement = self._other_fingerprint(call, found)
            self._now.why = "its fingerprint differs from the recorded call's"
            return operands
        self._now.call = call
        return call.inputs

    def outputs(self, params: dict, operands: Sequence[np.ndarray], device: int,
                mesh_axes: tuple, native: Sequence[np.ndarray] | None) -> list[np.ndarray]:
        call: RecordedCall | None = self._now.call
        if call is None:
            raise NotCompared(self._now.why)
        return [np.array(x) for x in call.outputs]

    def config_dict(self) -> dict | None:
        return None

    def _absent(self, device: int, index: int, record: CallDiff) -> str:
        """Why a call has no recorded outputs; a disagreement unless the chip's run had
        ended (failed) before it."""
        recorded = self._recorded[device]
        error = self.recording.script_error
        if error is not None and index == recorded:
            with self._lock:
                self.chip_failed.add((device, index))
            return f"the chip's run failed at this call: {error}"
        if error is not None:
            return f"the chip's run ended at call {recorded}"
        record.disagreement = (f"not in the recording (it holds"
                               f" {plural(recorded, 'call')} on device {device})")
        return "not in the recording"

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


class ReplayCommand(DiffCommand):
    """`pallas-check replay` for runner.run_command: diff against a RecordedSide, judged
    by the recording's rules (see the module)."""

    side: RecordedSide

    def verdict(self, outcome: ScriptOutcome, ours: list[str], fmt: str,
                to_stdout: bool) -> Verdict:
        session = self.session
        error = session.ours.engine_error or (ours[0] if ours else None) or session.side_error
        error = short_error(error) if error else None
        calls = sorted(session.calls, key=lambda c: (c.index, c.device))
        by_call = collections.Counter(f.call_index for f in session.ours.findings)
        for call in calls:
            call.findings = by_call[call.ours_index] if call.ours_index is not None else 0
            _judge_call(call, (call.device, call.index) in self.side.chip_failed)
        disagreements = self.side.missing()
        chip_error = self.side.recording.script_error
        user_failed = not outcome.ok and error is None
        if chip_error is not None and not self.side.chip_failed:  # failed after its calls
            if user_failed:
                user_failed = False  # the script fails here as it did on the chip
            else:
                disagreements.append(f"the chip's run failed after its last call"
                                     f" ({chip_error}); ours ran to the end")
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


def _judge_call(call: CallDiff, chip_failed: bool) -> None:
    """The chip failed at this call <=> ours reports a finding for it."""
    found = f"ours reported {plural(call.findings, 'finding')}"
    if chip_failed:
        if call.findings:
            call.note = f"{call.error}; {found} (agree)"
        else:
            call.disagreement = f"{call.error}; ours reported no finding"
        call.error = None
    elif call.findings and call.disagreement is None and call.outputs:
        call.disagreement = (f"{found} (`pallas-check run` shows them); the chip ran it"
                             f" without an error")


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
                          tolerance: Tolerance, fmt: str, output: Path | None) -> ExitCode:
    """`pallas-check replay`: the recorded script under the simulation, each call held to
    the chip's recorded outputs."""
    side = RecordedSide(made, path)
    command = ReplayCommand(made.script, config, side, *tolerance)
    return runner.run_command(command, made.script, made.args, fmt, output)
