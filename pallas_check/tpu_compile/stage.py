"""The compile stage of a run: calls recorded while the script runs, compiled after it
(with no interception installed, so the real Pallas TPU lowering is the one used), and
what failed turned into findings placed in the user's code.

Shared by `run --compile` (runner.CheckCommand), `pallas-check compile` (compile-only) and
the pytest plugin.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Protocol, Sequence

import numpy as np

from pallas_check.config import Config, TpuGeneration, parse_generations
from pallas_check.findings.finding import (CallSummary, Finding, FindingKind, FindingStore, JsonObject,
                                   KernelInfo, SourceFrame)
from pallas_check.tpu_compile.compiler import (CompileOutcome, MeshAxes, OperandAvals, Params,
                                               compile_call)
from pallas_check.jaxbridge.call import takes_semaphores
from pallas_check.tpu_compile.allocations import format_bytes
from pallas_check.tpu_compile.locate import place

LARGEST = 3  # allocations a vmem-exceeded finding names
MIB_FOR_REST = 1024 * 1024  # beyond the named allocations, worth saying


@dataclasses.dataclass
class RecordedCall:
    """One intercepted call, as much of it as compiling needs."""

    index: int
    params: Params
    avals: OperandAvals  # ((shape, dtype name), ...) of one device's operands
    mesh_axes: MeshAxes
    kernel: KernelInfo
    call_site: SourceFrame | None


class CompileRecorder:
    """Keeps each call's params and operand shapes (not its values) while the script runs."""

    def __init__(self) -> None:
        self.calls: list[RecordedCall] = []
        self._lock = threading.Lock()

    def record(self, index: int, params: Params, operands: Sequence[np.ndarray],
               mesh_axes: MeshAxes,
               kernel: KernelInfo, call_site: SourceFrame | None) -> None:
        avals = tuple((tuple(int(d) for d in np.shape(x)), str(np.result_type(x)))
                      for x in operands)
        with self._lock:
            self.calls.append(RecordedCall(index, params, avals, tuple(mesh_axes), kernel,
                                           call_site))


class CheckedSession(Protocol):
    """What the compile stage reads and extends of a checked run (intercept/session.py's `Session`,
    which this stage may not import): its recorder, options, findings and call summaries."""

    @property
    def config(self) -> Config: ...

    @property
    def findings(self) -> list[Finding]: ...

    @property
    def store(self) -> FindingStore: ...

    @property
    def calls(self) -> Sequence[CallSummary]: ...


@dataclasses.dataclass
class StageResult:
    findings: list[Finding]
    by_call: dict[int, dict[str, CompileOutcome]]  # call index -> generation -> outcome


def compile_recorded(calls: Sequence[RecordedCall],
                     generations: Sequence[TpuGeneration]) -> StageResult:
    """Compile every recorded call for every generation (each distinct one once). A call
    that takes semaphore arrays from another call is not compiled alone (no outcome), as
    the compile at the call leaves it (intercept/patched_lowering.py)."""
    findings: list[Finding] = []
    by_call: dict[int, dict[str, CompileOutcome]] = {}
    for call in sorted(calls, key=lambda c: c.index):
        if takes_semaphores(call.params):
            continue
        outcomes = by_call.setdefault(call.index, {})
        for generation in generations:
            outcome = compile_call(call.params, call.avals, call.mesh_axes, generation)
            outcomes[generation.value] = outcome
            if not outcome.ok:
                findings.append(finding_for(call, outcome))
    return StageResult(findings, by_call)


def finding_for(call: RecordedCall, outcome: CompileOutcome) -> Finding:
    """The finding of a failed compile, at the user's line it is about."""
    diagnosis = outcome.diagnosis
    assert diagnosis is not None
    generation = outcome.generation.value
    frame, buffer = place(call, outcome)
    details: JsonObject = {"error_code": diagnosis.code}
    if diagnosis.kind == "vmem-exceeded":
        largest = list(outcome.allocations[:LARGEST])
        buffer = largest[0].name if largest else buffer
        details.update(used_bytes=diagnosis.used_bytes,
                       available_bytes=diagnosis.available_bytes,
                       allocations=[dataclasses.asdict(a) for a in outcome.allocations])
        names = ", ".join(a.describe() for a in largest) or "none of the kernel's own"
        # Scratch operands are part of the scoped VMEM (see CompileOutcome.used_bytes).
        named = sum(a.nbytes for a in outcome.allocations)
        rest = (diagnosis.used_bytes or 0) - named
        message = (f"{generation}: {format_bytes(diagnosis.used_bytes or 0)} of VMEM needed,"
                   f" {format_bytes(diagnosis.available_bytes or 0)} available"
                   f" ({diagnosis.sentence}){_code(diagnosis.code)}; largest allocations:"
                   f" {names}"
                   + (f"; the compiler's own scratch (intermediate values): about"
                      f" {format_bytes(rest)}" if rest > MIB_FOR_REST
                      and not diagnosis.whole_sparsecore else ""))
        kind = FindingKind.VMEM_EXCEEDED
    else:
        message = f"{generation}: {diagnosis.sentence}{_code(diagnosis.code)}"
        kind = FindingKind.COMPILE_ERROR
    return Finding(kind=kind, message=message, kernel=call.kernel, call_index=call.index,
                   buffer=buffer, memory_space="VMEM" if buffer else "",
                   frames=(frame,) if frame is not None else (), details=details,
                   merge=generation, generation=generation, help=diagnosis.help)


def _code(code: str | None) -> str:
    return f" [{code}]" if code else ""


def compile_session(session: CheckedSession, generations: Sequence[TpuGeneration] | None = None
                    ) -> None:
    """`--compile` after a checked run: every call the session recorded compiled for
    `generations` (default: each of `--tpu`; intercept/generations.py compiles each further one
    from its own trace); the failures join its findings, each call's summary gets its
    footprint per generation."""
    recorder = getattr(session, "compile_recorder", None)
    if recorder is None:
        return
    result = compile_recorded(recorder.calls, generations if generations is not None
                              else parse_generations(session.config.tpu))
    # What the simulation already found Mosaic refuses (engine/jaxpr/mosaic_limits.py), at the
    # same line of the same call, is one defect: its finding stays, the compiler's joins it.
    known = {(f.call_index, f.frames[:1]) for f in session.findings
             if f.kind == FindingKind.COMPILE_ERROR and f.skipped}
    result.findings[:] = [f for f in result.findings
                          if (f.call_index, f.frames[:1]) not in known]
    per_call = _replace_reckoned(session.store, result.findings, result.by_call)
    session.store.extend(result.findings)
    for finding in result.findings:
        per_call[finding.call_index] = per_call.get(finding.call_index, 0) + 1
    for summary in session.calls:
        outcomes = result.by_call.get(summary.index)
        if outcomes:
            # With its compile time (the Python API's CallSummary); the JSON report
            # leaves that out to stay byte-identical run to run.
            summary.compiled = {g: o.summary() for g, o in outcomes.items()}
            summary.findings += per_call.get(summary.index, 0)


def _replace_reckoned(store: FindingStore, findings: list[Finding],
                      by_call: dict[int, dict[str, CompileOutcome]]) -> dict[int, int]:
    """The compiler's verdicts replace the engine's own reckoning of the same call and
    generation (engine/call/capacity.py): a vmem-exceeded with the compiler's numbers, or
    a compile that succeeded, which withdraws the reckoned finding (the reckoning is only
    an estimate of what the compiler allocates). A call the engine did not simulate says
    so in the compiler's finding too. Per call, how many findings were removed (negative
    counts)."""
    verdicts = {(f.call_index, f.generation): f for f in findings
                if f.kind == FindingKind.VMEM_EXCEEDED}
    compiled = {(index, generation) for index, outcomes in by_call.items()
                for generation, outcome in outcomes.items() if outcome.ok}
    replaced = [f for f in store.all() if f.reckoned
                and ((f.call_index, f.generation) in verdicts
                     or (f.call_index, f.generation) in compiled)]
    store.discard(lambda f: any(f is r for r in replaced))
    per_call: dict[int, int] = {}
    for finding in replaced:
        per_call[finding.call_index] = per_call.get(finding.call_index, 0) - 1
        verdict = verdicts.get((finding.call_index, finding.generation))
        if verdict is None:
            continue
        if finding.simulated is False and verdict.simulated is None:
            verdict.simulated = False
            verdict.message += "; " + finding.message.rsplit("; ", 1)[-1]
    return per_call
