"""Each TPU generation of `--tpu` traced as itself, compiled as it traces.

A wrapper picks its shapes by the chip it is told it runs on: a SparseCore kernel's vectors
are `get_sparse_core_info().num_lanes` wide (8 on v6e, 16 on v7x), block sizes follow
`get_tpu_info()`. A call traced as v6e and compiled for v7x is not the call v7x would run,
and its failure ("Get only supports int32 arrays of shapes [(16,)], got (8,)") is false.
So with several generations the script runs once per generation: the first generation's run
is the run itself (`run`, `compile`); each further one is the script run again in a process
of its own (`retrace_in_child`: fresh imports, so the module constants and caches of the
script's own modules answer as that chip too), told that chip, its calls compiled for it
alone. In `run` the further runs simulate their calls (the script gets real outputs, as in
the run itself) and, with `--tpu-all`, their findings count too; in `compile` they answer
with zeros as `compile` does (commands/retrace.py is that process). The pytest plugin runs a test's
body again in its own process instead (retrace.rerun_in_process): what the test's module
computed when it was imported stays as the first chip made it. Nothing runs again when the
first run never asked which chip it runs on (tpu_info.questions()): its trace is every
generation's.

What each further run did is kept per generation (`GenerationRun`) and merged into the
first run's session (`merge`): its compiled calls' outcomes under that generation, its
findings (one already found by the first run is not counted twice), how long the run took.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Protocol, Sequence

from pallas_check.config import Config, TpuGeneration, parse_generations
from pallas_check.process.execfile import ScriptOutcome
from pallas_check.findings.finding import CallSummary, Finding, FindingKind, FindingStore, JsonObject
from pallas_check.report.builds import CallRow
from pallas_check.tpu_compile.stage import compile_session
from pallas_check.intercept.tpu_info import questions

COMPILER_KINDS = (FindingKind.COMPILE_ERROR, FindingKind.VMEM_EXCEEDED)
_TAIL = 2000  # characters of a failed child's stderr kept in the error


@dataclasses.dataclass
class GenerationRun:
    """One further generation's run of the script (or of a test)."""

    generation: str
    seconds: float  # the script's run (compiling after it not included)
    own_process: bool
    findings: list[Finding]
    # Call index -> (kernel name, this generation's compile summary: CompileOutcome.summary()).
    compiled: dict[int, tuple[str, JsonObject]] = dataclasses.field(default_factory=dict)
    # `pallas-check compile`: its report's call rows (compile_command.call_row).
    rows: list[CallRow] = dataclasses.field(default_factory=list)
    calls: int = 0
    script_error: str | None = None
    internal_error: str | None = None
    # Its process from start to end (JAX's start, the script, compiling), as its parent saw.
    process_seconds: float = 0.0

    def note(self) -> JsonObject:
        """What a report says of it; its times under "seconds" and "process_seconds"
        (which a JSON run report leaves out: it stays the same run to run)."""
        return {"own_process": self.own_process, "calls": self.calls,
                "findings": len(self.findings), "script_error": self.script_error,
                "seconds": round(self.seconds, 3),
                "process_seconds": round(self.process_seconds, 3)}


class RunSession(Protocol):
    """What this module reads and changes of a run's session (intercept/session.py's `Session`,
    which imports this module: described here, not imported)."""

    @property
    def config(self) -> Config: ...
    @property
    def questions_from(self) -> int | None: ...
    @property
    def retrace(self) -> Callable[[TpuGeneration], GenerationRun] | None: ...
    @property
    def compile_recorder(self) -> object: ...  # only whether there is one
    @property
    def traces(self) -> dict[str, JsonObject]: ...
    @property
    def store(self) -> FindingStore: ...
    @property
    def calls(self) -> Sequence[CallSummary]: ...
    @property
    def findings(self) -> list[Finding]: ...
    @property
    def engine_error(self) -> str | None: ...

    def stop_in_flight(self, index: int | None = None) -> None: ...

    def finish(self) -> None: ...


def asked_since(asked_from: int | None) -> bool:
    """Whether anything asked which chip it runs on since `asked_from`
    (tpu_info.questions(); None: not known, so yes). A run that never asked traced nothing
    that depends on the chip: its trace is every generation's."""
    return asked_from is None or questions() > asked_from


def after_run(session: RunSession) -> None:
    """After the first generation's run: its calls compiled (for it alone when further
    generations are run again, else for every generation from this one trace), then each
    further generation run again and merged. Run again: with several generations, when
    --compile or --tpu-all wants what each traces and the run asked which chip it runs on;
    the Python API cannot run a block again (its trace is compiled for each, and the
    report says so)."""
    config = session.config
    generations = parse_generations(config.tpu)
    depends = (len(generations) > 1 and (config.compile or config.tpu_all)
               and asked_since(session.questions_from))
    retrace = session.retrace if depends else None
    if session.compile_recorder is not None:
        compile_session(session, generations[:1] if retrace is not None else generations)
    if retrace is not None:
        for generation in generations[1:]:
            merge(session, retrace(generation))
    elif depends and session.compile_recorder is not None:
        for generation in generations[1:]:
            session.traces[generation.value] = {"traced_as": generations[0].value}


def merge(session: RunSession, run: GenerationRun) -> None:
    """A further generation's run into the first run's session (see the module). The
    first run's reckoning of this generation's VMEM (engine/call/capacity.py) was of the
    first generation's trace: this generation's own run reckons (or compiles) its own."""
    if run.internal_error is not None:
        raise RuntimeError(f"the script's run as {run.generation}: {run.internal_error}")
    by_index = {c.index: c for c in session.calls}
    stale = [f for f in session.findings if f.reckoned and f.generation == run.generation]
    session.store.discard(lambda f: any(f is s for s in stale))
    for finding in stale:
        if finding.call_index in by_index:
            by_index[finding.call_index].findings -= 1
    seen = {f.merge_key() for f in session.findings}
    known = {(f.call_index, f.frames[:1]) for f in session.findings
             if f.kind == FindingKind.COMPILE_ERROR and f.skipped}
    fresh = []
    for finding in run.findings:
        if finding.merge_key() in seen or (
                finding.kind == FindingKind.COMPILE_ERROR
                and (finding.call_index, finding.frames[:1]) in known):
            continue
        if finding.kind not in COMPILER_KINDS:
            finding.message = f"traced as {run.generation}: {finding.message}"
            finding.details["traced_as"] = run.generation
        fresh.append(finding)
    session.store.extend(fresh)
    for index, (kernel, summary) in run.compiled.items():
        call = by_index.get(index)
        if call is not None and call.kernel == kernel:
            call.compiled[run.generation] = summary
    for finding in fresh:
        call = by_index.get(finding.call_index)
        if call is not None:
            call.findings += 1
    session.traces[run.generation] = run.note()


def from_session(session: RunSession, outcome: ScriptOutcome, ours: Sequence[str],
                 generation: TpuGeneration, seconds: float, own_process: bool) -> GenerationRun:
    """A further generation's finished session as its GenerationRun: its compiler's
    findings for that generation, and with --tpu-all every finding."""
    session.stop_in_flight()
    session.finish()
    error = session.engine_error or (ours[0] if ours else None)
    if error is None and session.compile_recorder is not None and not outcome.interrupted:
        compile_session(session, (generation,))
    keep_all = session.config.tpu_all
    findings = [f for f in session.findings if keep_all or (
        f.kind in COMPILER_KINDS and f.generation == generation.value and not f.skipped)]
    compiled = {c.index: (c.kernel, c.compiled[generation.value]) for c in session.calls
                if generation.value in c.compiled}
    return GenerationRun(generation.value, seconds, own_process, findings, compiled,
                         calls=len(session.calls),
                         script_error=None if outcome.ok else outcome.error,
                         internal_error=error)


def further_config(config: Config, generation: TpuGeneration) -> Config:
    """The Config of a further generation's run: that chip; without --tpu-all its findings
    are not kept, so no check that only costs time (races, schedules, the second fill)."""
    chosen = dataclasses.replace(config, tpu=generation.value, timeline=False)
    if config.tpu_all:
        return chosen
    return dataclasses.replace(chosen, races=False, schedules=1, keep_going=False,
                               check_uninit_outputs=False)


def retrace_in_child(script: str, args: Sequence[str], config: Config | None,
                     generation: TpuGeneration, devices: int = 1) -> GenerationRun:
    """The script run again as `generation` in a process of its own: checked with
    `config` (`run`), or, with None, recorded and answered with zeros (`compile`)."""
    with tempfile.TemporaryDirectory(prefix="pallas-check-") as folder:
        request, result = Path(folder) / "request.pickle", Path(folder) / "result.pickle"
        request.write_bytes(pickle.dumps((os.path.abspath(script), list(args), config,
                                          generation)))
        env = dict(os.environ)
        flags = [f for f in env.get("XLA_FLAGS", "").split()
                 if not f.startswith("--xla_force_host_platform_device_count")]
        if devices > 1:
            flags.append(f"--xla_force_host_platform_device_count={devices}")
        env["XLA_FLAGS"] = " ".join(flags)
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "pallas_check.commands.retrace",
                               str(request), str(result)], env=env, capture_output=True,
                              text=True, cwd=os.getcwd())
        if proc.returncode != 0 or not result.exists():
            tail = " ".join(proc.stderr[-_TAIL:].split())
            return GenerationRun(generation.value, 0.0, True, [],
                                 internal_error=f"exit {proc.returncode}: {tail}")
        found: GenerationRun = pickle.loads(result.read_bytes())
        found.process_seconds = time.perf_counter() - started
        return found
