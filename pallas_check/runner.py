"""Owns one checked run: install interception, run the user's script, report, exit code."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import sys
import threading
from pathlib import Path
from typing import Any, Iterator, Sequence

from pallas_check.config import Config
from pallas_check.exitcodes import ExitCode
from pallas_check.report import reporter_for
from pallas_check.report.model import RunReport


def config_dict(config: Config) -> dict:
    return {k: (v.value if hasattr(v, "value") else v)
            for k, v in dataclasses.asdict(config).items()}


def exit_code_for(findings: int, user_failed: bool, engine_failed: bool) -> ExitCode:
    """Our failure outranks the user's; the user's outranks findings."""
    if engine_failed:
        return ExitCode.INTERNAL
    if user_failed:
        return ExitCode.USER_ERROR
    return ExitCode.FINDINGS if findings else ExitCode.CLEAN


def run_and_report(script: str, args: Sequence[str], config: Config, fmt: str,
                   output: Path | None) -> ExitCode:
    from pallas_check.execfile import run_script
    from pallas_check.session import Session

    session = Session(config)
    with _callback_failures() as ours, session.install(), _progress_bar(session, config):
        outcome = run_script(script, args)
    if session.interrupted and not outcome.interrupted:
        # Ctrl-C hit a call's simulation: the script saw it as JAX's callback error (or
        # caught that). It is still an interruption: a partial report, not the user's bug.
        from pallas_check.execfile import ScriptOutcome

        outcome = ScriptOutcome(ok=False, interrupted=True, error="interrupted (Ctrl-C)")
    findings = session.findings
    engine_error = session.engine_error or (ours[0] if ours else None)
    if engine_error is not None:
        engine_error = one_line(engine_error)
    engine_failed = engine_error is not None
    user_failed = not outcome.ok and not engine_failed
    code = exit_code_for(len(findings), user_failed, engine_failed)
    report = RunReport(
        script=script,
        config=config_dict(config),
        findings=findings,
        calls=sorted(session.calls, key=lambda c: c.index),
        exit_code=int(code),
        user_error=outcome.error if user_failed else None,
        user_traceback=outcome.traceback if user_failed else None,
        internal_error=engine_error,
        partial=outcome.interrupted,
        script_args=tuple(args),
    )
    buffer = io.StringIO()
    reporter_for(fmt).render(report, buffer)
    if user_failed and (fmt != "table" or output is not None):
        # The table on stdout shows the script's failure; otherwise it goes where Python
        # would have put it, so that `--format json` or `--output` does not hide it.
        sys.stderr.write(outcome.traceback
                         or f"pallas-check: the script failed: {outcome.error}\n")
    if output is not None:
        from pallas_check.cli import write_atomically

        write_atomically(output, buffer.getvalue())
        if fmt != "table":
            print(f"pallas-check: {len(findings)} finding(s); report written to {output}",
                  file=sys.stderr)
        else:
            sys.stderr.write(buffer.getvalue().splitlines()[-1] + "\n")
    else:
        sys.stdout.write(buffer.getvalue())
        sys.stdout.flush()
    if engine_failed:
        print(f"pallas-check: error: {engine_error}", file=sys.stderr)
    return code


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def one_line(message: str) -> str:
    """An error message as one line, without object addresses (reports are reproducible)."""
    return " ".join(_ADDRESS.sub("", message).split())


@contextlib.contextmanager
def _progress_bar(session: Any, config: Config) -> Iterator[None]:
    """A rich progress bar over the schedules of each call (only on a terminal)."""
    if config.schedules <= 1 or not sys.stderr.isatty():
        yield
        return
    from rich.progress import Progress

    with Progress(transient=True) as progress:
        tasks: dict[int, Any] = {}

        def update(call_index: int, kernel: str, done: int, total: int) -> None:
            if call_index not in tasks:
                tasks[call_index] = progress.add_task(
                    f"call {call_index} ({kernel}): schedules", total=total)
            progress.update(tasks[call_index], completed=done)

        session.progress = update
        try:
            yield
        finally:
            session.progress = None


@contextlib.contextmanager
def _callback_failures() -> Iterator[list[str]]:
    """While active, exceptions our host callback raised that are bugs of ours (not an
    `EngineFailure`, whose message the session already holds, nor Ctrl-C) are kept."""
    from pallas_check.intercept import handler_failures
    from pallas_check.session import EngineFailure

    errors: list[str] = []
    lock = threading.Lock()

    def keep(exc: BaseException) -> None:
        if not isinstance(exc, (EngineFailure, KeyboardInterrupt)):
            with lock:
                errors.append(f"internal error in pallas-check's host callback:"
                              f" {type(exc).__name__}: {exc}")

    with handler_failures(keep):
        yield errors
