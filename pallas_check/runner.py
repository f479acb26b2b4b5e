"""Owns one checked run: install interception, run the user's script, report, exit code."""

from __future__ import annotations

import dataclasses
import io
import sys
from pathlib import Path
from typing import Sequence

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
    with session.install():
        outcome = run_script(script, args)
    findings = session.findings
    engine_failed = session.engine_error is not None
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
        internal_error=session.engine_error,
        partial=outcome.interrupted,
    )
    buffer = io.StringIO()
    reporter_for(fmt).render(report, buffer)
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
        print(f"pallas-check: error: {session.engine_error}", file=sys.stderr)
    return code
