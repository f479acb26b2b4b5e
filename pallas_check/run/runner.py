"""Owns one checked run: install interception, run the user's script, report, exit code."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import sys
import threading
from pathlib import Path
from typing import ContextManager, Iterator, Protocol, Sequence

from pallas_check.process import children
from pallas_check.process import interrupts
from pallas_check.report import suppress
from pallas_check.config import Config, TpuGeneration
from pallas_check.deliver.delivery import (deliver, flush_streams, note, report_owns_stdout,
                                   script_streams)
from pallas_check.config.errors import MAX_ERROR_CHARS, one_line, short_error  # noqa: F401 (their old home)
from pallas_check.config.errors import EngineFailure, SuppressionError
from pallas_check.process.execfile import ScriptOutcome, run_script
from pallas_check.config.exitcodes import ExitCode, exit_code_for
from pallas_check.findings.finding import CallSummary, JsonObject
from pallas_check.intercept.generations import after_run, retrace_in_child
from pallas_check.intercept.patched_lowering import InterceptionFailed, handler_failures
from pallas_check.jaxbridge import settle_runtime_tokens
from pallas_check.deliver.outfile import OutputError, write_report
from pallas_check.deliver.progress_line import ProgressLine, clear, wanted
from pallas_check.report import Format, reporter_for
from pallas_check.config.display import display_for
from pallas_check.report.run_report import RunReport, suppressed_text
from pallas_check.report.trace import TraceWriter
from pallas_check.intercept.chip import NOT_CHECKED
from pallas_check.intercept.session import Session
from pallas_check.run.spawned import start_spawned_child
from pallas_check.findings.units import findings_in_calls, plural
from pallas_check.process.watchdog import Watchdog


def config_dict(config: Config) -> JsonObject:
    return {k: (v.value if hasattr(v, "value") else v)
            for k, v in dataclasses.asdict(config).items()}


@dataclasses.dataclass
class Verdict:
    """What a command made of a finished run: the report as text and its exit code. Every
    command ends in one (`run`, `diff`, `compile`, `run --native`: `Command.verdict`; a
    test under `pytest --pallas-check`: `checks_verdict`)."""

    text: str
    code: ExitCode
    summary: str  # the stderr line when the report went to a file ("3 findings ...")
    error: str | None = None  # pallas-check's own failure, one line
    traceback: str | None = None  # the script's traceback, shown on stderr unless in a table


class Command(Protocol):
    """What `run`, `diff` and `run --native` differ in: what is installed while the script
    runs, and how the finished run becomes a report. Everything else is `run_command`'s."""

    def installed(self) -> ContextManager[object]: ...

    def calls_in_flight(self) -> int: ...

    def failed(self) -> bool:
        """Whether pallas-check's own callback failed (JAX then keeps failed tokens)."""
        ...

    def verdict(self, outcome: ScriptOutcome, ours: list[str], fmt: str,
                to_stdout: bool) -> Verdict:
        ...


def run_command(command: Command, script: str, args: Sequence[str], fmt: str,
                output: Path | None) -> ExitCode:
    """The one run path: run the script with `command` installed, under the watchdog, and
    deliver its verdict (also on Ctrl-C, a stuck call or the script's os._exit). Only
    this process reports: a process the script forks or spawns never does (process/children.py)."""
    finisher = _Finisher(command, fmt, output)
    child_config = getattr(command, "child_config", lambda: None)()  # (`run`'s only)
    with (interrupts.handled(),  # Ctrl-C and SIGTERM alike (process/interrupts.py)
          children.owned(child_config, start_spawned_child,
                         prints_to_stderr=report_owns_stdout(fmt, output))):
        with (children.undone_in_child(interrupts.forget_in_child),
              callback_failures() as ours, command.installed(),
              Watchdog(finisher.emergency, command.calls_in_flight),
              _reporting_os_exit(finisher), script_streams(fmt, output)):
            finisher.ours = ours
            outcome = _run_unless_stopped(script, args)
            children.end_if_child(outcome)  # a forked child ends here, reporting nothing
            _settle_computations()
        code = finisher.finish(outcome)
        if interrupts.requested():  # stopped: nothing the script started outlives the run
            children.end_children()
        return code


def _run_unless_stopped(script: str, args: Sequence[str]) -> ScriptOutcome:
    """The script's outcome; not run when a stop (Ctrl-C, SIGTERM) came while the run was
    set up, and interrupted when one came while it ran, even if the script (or a callback
    that swallows exceptions, as JAX's garbage-collector hook does) caught it."""
    try:
        if not interrupts.requested():
            with interrupts.delivering():
                outcome = run_script(script, args)
            if not interrupts.requested():
                return outcome
    except KeyboardInterrupt:  # a stop just before the script or just after it
        pass
    return ScriptOutcome(ok=False, interrupted=True, error=interrupts.reason())


def run_and_report(script: str, args: Sequence[str], config: Config, fmt: str,
                   output: Path | None, policy: suppress.Policy | None = None,
                   trace: Path | None = None) -> ExitCode:
    """`pallas-check run`: every call simulated and checked (`policy`: suppress.Policy;
    `trace`: where the timeline goes, with config.timeline on)."""
    command = CheckCommand(script, args, config, policy, trace, progress=wanted(fmt, output))
    return run_command(command, script, args, fmt, output)


class CheckCommand:
    """`pallas-check run`: a Session checks every call; the report lists its findings."""

    def __init__(self, script: str, args: Sequence[str], config: Config,
                 policy: suppress.Policy | None = None, trace: Path | None = None,
                 progress: bool = False) -> None:
        self.script, self.args, self.config = script, args, config
        self.policy = policy if policy is not None else suppress.Policy()
        self.trace = trace
        self.progress = progress  # a progress line on stderr (deliver/progress_line.py)
        self.session = Session(config)
        self.session.retrace = lambda generation: retrace_in_child(
            script, args, config, generation, config.devices)
        if trace is not None:  # written as the run goes (report/trace.py)
            self.session.trace = TraceWriter(trace, script)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        with self.session.install(), showing_progress(self.session, self.progress):
            yield

    def child_config(self) -> Config:
        """What a process the script spawns checks its calls with (process/children.py): this
        run's checks; the timeline and --compile stay the owner's."""
        return dataclasses.replace(self.config, timeline=False, compile=False)

    def calls_in_flight(self) -> int:
        return self.session.calls_in_flight

    def failed(self) -> bool:
        return self.session.engine_error is not None

    def verdict(self, outcome: ScriptOutcome, ours: list[str], fmt: str,
                to_stdout: bool) -> Verdict:
        # What the script's processes found:
        children.adopt_children(self.session, children.run_folder())
        done = finished_report(self.session, outcome, ours, self.policy,
                               Origin(self.script, tuple(self.args)))
        report, kept = done.report, done.kept
        code = ExitCode(report.exit_code)
        baseline_failed = self.policy.update_baseline and not self._update_baseline(
            kept, finished=done.finished)
        trace_written = self._write_trace(kept) if self.trace is not None else None
        if (baseline_failed or trace_written is False) and code < ExitCode.USAGE:
            code = ExitCode.USAGE  # a file asked for is not where it was asked for
        report.exit_code = int(code)
        report.trace = str(self.trace_shown) if trace_written else None
        report.trace_notes = self.session.trace.notes if trace_written else []
        text = rendered(report, fmt, to_stdout)
        summary = findings_summary(report)
        failure = (script_traceback(done.outcome) if done.user_failed or done.chip_stop
                   else None)
        if done.user_failed and done.outcome.interrupted:  # one line: how it stopped, where
            stopped = stopped_text(done.outcome.error, report.calls)
            summary = f"{stopped}; {summary}"
            failure = f"pallas-check: {stopped}\n" if to_stdout else None
        if (done.wrong_chip is not None and not report.calls and Format(fmt).for_people
                and to_stdout):
            return Verdict("", code, summary, done.wrong_chip)  # one line: nothing else ran
        return Verdict(text, code, summary, report.internal_error, failure)

    @property
    def trace_shown(self) -> str:
        """The --trace path as the user can open it (relative when below the cwd)."""
        assert self.trace is not None
        relative = os.path.relpath(self.trace)
        return str(self.trace) if relative.startswith(os.pardir) else relative

    def _write_trace(self, kept: suppress.Outcome) -> bool:
        """`--trace`: the Chrome trace JSON written as the run went, put in place (as a
        report is: atomically), the calls a stop cut short as far as they got."""
        assert self.trace is not None
        try:
            self.session.trace.close(kept.active, kept.suppressed)
        except (OSError, OutputError) as exc:
            note(f"pallas-check: error: cannot write the trace {self.trace}: {exc}")
            return False
        note(f"pallas-check: trace of {plural(self.session.trace.calls_written, 'call')}"
             f" written to {self.trace_shown} (open it in ui.perfetto.dev)")
        return True

    def _update_baseline(self, kept: suppress.Outcome, finished: bool) -> bool:
        """`--update-baseline`: this run's findings become the baseline, written the way
        reports are (atomically; a link stays a link); not after a run that did not finish,
        whose findings are incomplete."""
        target = self.policy.baseline
        if not finished:
            note(f"pallas-check: the baseline {target} was not updated: the run did not"
                 " finish")
            return True
        baselined = [f for f, why in kept.suppressed if why.by == "baseline"]
        try:  # merged with what other runs wrote meanwhile (report/suppress.py locks the file)
            suppress.update_baseline(self.policy, baselined, self.script, write_report)
        except (OSError, OutputError, SuppressionError) as exc:
            note(f"pallas-check: error: cannot write the baseline {target}: {exc}")
            return False
        note(f"pallas-check: baseline of {plural(len(baselined), 'finding')} written to {target}")
        return True


def rendered(report: RunReport, fmt: str, to_stdout: bool = False) -> str:
    """The report in `fmt`, as shown on stdout (its width and colours) or in a file."""
    buffer = io.StringIO()
    reporter_for(fmt, display=display_for(sys.stdout if to_stdout else None)).render(
        report, buffer)
    return buffer.getvalue()


def findings_summary(report: RunReport) -> str:
    """`3 findings in 2 pallas_calls; 1 suppressed (...)`: the wording of the report's own
    summary line (report/table.py `summary_line`)."""
    suppressed = f"; {suppressed_text(report)}" if report.suppressed else ""
    calls = sum(1 for c in report.calls if not getattr(c, "failed", False))  # as the report does
    return findings_in_calls(len(report.findings), calls) + suppressed


def checks_verdict(report: RunReport, fmt: str = "table") -> Verdict:
    """The verdict on what the checking alone found in a block of code whose own outcome
    is its caller's to show and rank (a test under `pytest --pallas-check`: pytest reports
    the test's own failure): the exit code `run` would give without that failure, and,
    unless that is clean, the report without it (no text for a clean verdict)."""
    code = exit_code_for(len(report.findings), False, report.internal_error is not None,
                         calls=len(report.calls))
    text = ""
    if code in (ExitCode.FINDINGS, ExitCode.INTERNAL):
        text = rendered(dataclasses.replace(report, user_error=None, user_traceback=None,
                                            partial=False, exit_code=int(code)), fmt)
    return Verdict(text, code, findings_summary(report), report.internal_error)


@dataclasses.dataclass(frozen=True)
class Origin:
    """What a report says its run was: the script (or, for the Python API and the pytest
    plugin, the block: a file or a test's node id) and its arguments, the command that
    runs it again (None: `pallas-check run` with the run's options), and the folder the
    suppression stage reads paths from (None: the current one)."""

    script: str
    args: tuple[str, ...] = ()
    rerun: str | None = None
    cwd: str | None = None


@dataclasses.dataclass
class Finished:
    """A finished session as a report: what `run` renders and the Python API returns."""

    report: RunReport
    kept: suppress.Outcome  # the findings that count and those suppressed
    outcome: ScriptOutcome  # how the script (or the API's block) ended, Ctrl-C in a call included
    user_failed: bool
    finished: bool  # ran to its end with no failure: its findings are complete
    wrong_chip: str | None = None  # the script's SparseCore mesh does not fit --tpu
    chip_stop: bool = False  # the script ended in a call the chip refuses (intercept/chip.py)


def finished_report(session: Session, outcome: ScriptOutcome, ours: list[str],
                    policy: suppress.Policy, origin: Origin) -> Finished:
    """The one way a finished session becomes a `RunReport` (the CLI's `run`, the Python
    API, the pytest plugin): --compile after the run, Ctrl-C inside a call, our failure
    over the user's, the suppression stage, the ranked exit code."""
    session.stop_in_flight()  # a call the run stopped in is listed, with its findings
    session.finish()
    compile_error = _compile_after_run(session, outcome)
    if session.interrupted and not outcome.interrupted:
        # Ctrl-C hit a call's simulation: the script saw it as JAX's callback error (or
        # caught that). It is still an interruption: a partial report, not the user's bug.
        outcome = ScriptOutcome(ok=False, interrupted=True, error=interrupts.reason())
    engine_error = session.engine_error or (ours[0] if ours else None) or compile_error
    if engine_error is not None:
        engine_error = short_error(engine_error)
    # A script that ended in the chip's refusal of a call (intercept/chip.py) ended on a
    # finding, not a bug of its own: exit 1, its traceback still shown.
    chip_stop = (not outcome.ok and engine_error is None
                 and session.chip.ended_program(outcome.exception))
    user_failed = not outcome.ok and engine_error is None and not chip_stop
    refused = sparsecore_refusal(outcome, session.config.tpu) if user_failed else None
    wrong_chip = refused[0] if refused is not None else None
    if wrong_chip is not None:  # one line, not the traceback of JAX's mesh constructor
        outcome = ScriptOutcome(ok=False, error=wrong_chip,
                                traceback=f"pallas-check: error: {wrong_chip}\n")
    calls = sorted(session.calls, key=lambda c: c.index)
    # Suppression is its own stage: after the analysis, before the report.
    kept = suppress.apply(session.findings, calls, policy, cwd=origin.cwd)
    code = exit_code_for(len(kept.active), user_failed, engine_error is not None,
                         calls=len(calls))
    if refused is not None:
        code = refused[1]
    if session.error_code is not None and engine_error == short_error(session.engine_error or ""):
        code = ExitCode(session.error_code)
    report = RunReport(
        script=origin.script, config=config_dict(session.config), findings=kept.active,
        calls=calls, exit_code=int(code),
        user_error=outcome.error if user_failed or chip_stop else None,
        user_traceback=outcome.traceback if user_failed or chip_stop else None,
        internal_error=engine_error, partial=outcome.interrupted, rerun=origin.rerun,
        script_args=origin.args, suppressed=kept.suppressed,
        passed_through=(session.call_filter.passed_through()
                        if session.call_filter is not None else {}),
        traces=dict(session.traces),
        notes=[NOT_CHECKED] if session.chip.not_checked else [])
    return Finished(report, kept, outcome, user_failed,
                    finished=outcome.ok and engine_error is None, wrong_chip=wrong_chip,
                    chip_stop=chip_stop)


def sparsecore_refusal(outcome: ScriptOutcome, tpu: TpuGeneration | str
                       ) -> tuple[str, ExitCode] | None:
    """One line and the exit code for a script that failed on a SparseCore kernel before
    any call reached us: the simulated chip (`--tpu`, default v5e) has no SparseCores, or
    fewer than the mesh asks for (JAX's mesh constructors read the chip, often at import:
    usage, exit 2); or the kernel runs several meshes at once (MPMD: JAX's CPU lowering of
    mpmd_map refuses it; not simulated yet, exit 4)."""
    exc = outcome.exception
    text = str(exc)
    chip = str(getattr(tpu, "value", tpu)).split(",")[0]
    if isinstance(exc, RuntimeError) and "does not have SparseCores" in text:
        return (f"this script builds a SparseCore mesh (plsc.VectorSubcoreMesh /"
                f" ScalarSubcoreMesh), but --tpu {chip} has no SparseCores:"
                f" pass --tpu v6e, v7x or v5p", ExitCode.USAGE)
    if isinstance(exc, ValueError) and "but the current TPU chip has only" in text:
        return (f"this script's SparseCore mesh does not fit --tpu {chip}"
                f" ({text.strip().splitlines()[0]}): v5p has 4 SparseCores x 16 subcores,"
                f" v6e and v7x 2 x 16", ExitCode.USAGE)
    if isinstance(exc, NotImplementedError) and "multiple mesh/function pairs" in text:
        return ("a pl.kernel over several meshes at once (MPMD: e.g. vector and scalar"
                " subcores) is not simulated yet by pallas-check", ExitCode.INTERNAL)
    return None


def _compile_after_run(session: Session, outcome: ScriptOutcome) -> str | None:
    """`--compile`: the calls the script made, compiled for the real TPUs now that no
    interception is installed, each further generation from its own run (intercept/generations.py;
    also for --tpu-all); None, or our failure as one line."""
    if outcome.interrupted or session.engine_error:
        return None
    try:
        after_run(session)
    except Exception as exc:  # noqa: BLE001 - ours; one line, exit 4
        return f"internal error while compiling for TPU: {type(exc).__name__}: {exc}"
    return None


def stopped_text(reason: str | None, calls: Sequence[CallSummary]) -> str:
    """`interrupted (Ctrl-C) in call 0 (my_kernel) after 1234 of 50000 grid steps`."""
    where = [f" in call {c.index} ({c.kernel}) {c.stopped_text()}"
             for c in calls if getattr(c, "interrupted", False)]
    return f"{reason or interrupts.reason()}{','.join(where)}"


def script_traceback(outcome: ScriptOutcome) -> str:
    """What stderr shows of a failed script: its traceback, or a line saying how it ended."""
    return outcome.traceback or f"pallas-check: the script failed: {outcome.error}\n"


def _settle_computations() -> None:
    """The script may end while computations it dispatched still run its calls (dispatch is
    asynchronous: a shard_map'd call whose result it never reads); wait for them here,
    under the watchdog, so that what they find or how they fail is in the report, on many
    devices as on one. After our callback failed, JAX keeps the failed computations'
    tokens and raises their errors again from its exit handlers (stray tracebacks of our
    frames after the report): forget them, the failure is in the report already."""
    settle_runtime_tokens()


class _Finisher:
    """Turns how the script ended into the delivered report and the exit code, exactly
    once: from the main thread at the end, from the watchdog when the run is stuck or
    interrupted, or from a script's `os._exit`."""

    def __init__(self, command: Command, fmt: str, output: Path | None) -> None:
        self.command, self.fmt, self.output = command, fmt, output
        self.ours: list[str] = []
        self.stdout = sys.stdout  # the report's, even while the script's goes to stderr
        self._lock = threading.Lock()
        self._code: ExitCode | None = None

    def emergency(self, reason: str) -> bool:
        """The watchdog's way out: a partial report; False when the run already reported."""
        with self._lock:
            if self._code is not None:
                return False
        self.finish(ScriptOutcome(ok=False, interrupted=True, error=reason))
        return True

    def finish(self, outcome: ScriptOutcome) -> ExitCode:
        with self._lock:
            if self._code is None:
                self._code = self._deliver(outcome)
            return self._code

    def _deliver(self, outcome: ScriptOutcome) -> ExitCode:
        clear()  # no progress line left over the report (the watchdog's way out too)

        to_stdout = self.output is None or str(self.output) == "-"
        verdict = self.command.verdict(outcome, self.ours, self.fmt, to_stdout)
        delivered = deliver(verdict.text, self.output, summary=verdict.summary,
                            shows_traceback=Format(self.fmt).for_people,
                            traceback_text=verdict.traceback, error=verdict.error,
                            stdout=self.stdout)
        code = verdict.code
        if not delivered and code < ExitCode.USAGE:
            code = ExitCode.USAGE  # the report is on stdout, not where it was asked for
        return code


@contextlib.contextmanager
def _reporting_os_exit(finisher: _Finisher) -> Iterator[None]:
    """A script that ends with `os._exit(n)` skips every `finally`: report first, then exit
    with the ranked code (a finding is not hidden by `os._exit(0)`). A process the script
    forks gets the real os._exit back (process/children.py): a pool worker ends with it."""
    real_exit = os._exit

    def exit_after_report(status: int) -> None:
        if threading.current_thread() is not threading.main_thread():
            real_exit(status)
        ok = status == 0
        code = finisher.finish(ScriptOutcome(
            ok=ok, exit_code=status,
            error=None if ok else f"the script called os._exit({status})"))
        flush_streams()
        real_exit(int(code))

    def real_exit_in_child() -> None:
        os._exit = real_exit

    os._exit = exit_after_report  # type: ignore[assignment]
    try:
        with children.undone_in_child(real_exit_in_child):
            yield
    finally:
        os._exit = real_exit


@contextlib.contextmanager
def showing_progress(session: Session, shown: bool) -> Iterator[None]:
    """The progress of each call on stderr (deliver/progress_line.py), when `shown`."""
    if not shown:
        yield
        return
    with ProgressLine(session):
        yield


@contextlib.contextmanager
def callback_failures() -> Iterator[list[str]]:
    """While active, exceptions our host callback raised that are bugs of ours (not an
    `EngineFailure`, whose message the session already holds, nor Ctrl-C) are kept."""
    errors: list[str] = []
    lock = threading.Lock()

    def keep(exc: BaseException) -> None:
        if isinstance(exc, InterceptionFailed):  # its message says what failed
            with lock:
                errors.append(str(exc))
        elif not isinstance(exc, (EngineFailure, KeyboardInterrupt)):
            with lock:
                errors.append(f"internal error in pallas-check's host callback:"
                              f" {type(exc).__name__}: {exc}")

    with handler_failures(keep):
        yield errors
