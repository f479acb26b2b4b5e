"""Every error a user of pallas-check can meet, each carrying the exit code it ends with.

One base class, `PallasCheckError`: its `exit_code` (config/exitcodes.py names the codes) is what
the command line exits with, and its message is the one line it prints after
`pallas-check: error: `. The command line maps an error to its exit code here, through the
base class, in one place (cli/app.py `_one_line`), never class by class; the Python API and
the pytest plugin read the same `exit_code`.

The modules that raise these import them from here (and keep the names importable where
they always were: `from pallas_check.report.suppress import SuppressionError` still works).

Not here, on purpose: the engine's control-flow exceptions (`CallHalted`, `Deadlock`,
`KernelError`, `EngineBug`, `UnsupportedPrimitive`, `RendezvousTimeout`, `NotLowered`,
`UnsupportedTransform`, `scalar._Fallback`). They never reach a user as such: each is
caught inside the engine or by the session and becomes a finding (a deadlock, an error in
the kernel) or an `EngineFailure` with a one-line message. They stay beside the code that
raises and catches them, and the engine imports nothing of the command line's (the
import-linter contracts in pyproject.toml), this module's exit codes included.

Nothing here imports JAX.
"""

from __future__ import annotations

import re
import textwrap
from typing import Protocol, Sequence

from pallas_check.config.environment import DEBUG_VARIABLE, debug_requested
from pallas_check.config.exitcodes import ExitCode


class PallasCheckError(Exception):
    """Base of the errors pallas-check reports to its user: one line, and the exit code
    the command ends with (INTERNAL unless a subclass says otherwise)."""

    exit_code: ExitCode = ExitCode.INTERNAL


class UsageError(PallasCheckError, ValueError):
    """A bad command-line value found after click read it, e.g. `diff --against` (exit 2).
    A ValueError too: a bad value of an option is one, wherever it is checked."""

    exit_code = ExitCode.USAGE


class SettingsError(PallasCheckError):
    """A bad `[tool.pallas-check]` table or `PALLAS_CHECK_*` variable (exit 2)."""

    exit_code = ExitCode.USAGE


class SuppressionError(PallasCheckError):
    """A bad `ignore` entry or baseline file (one line; exit 2)."""

    exit_code = ExitCode.USAGE


class OutputError(PallasCheckError):
    """The report cannot go where `--output` says (one line, names the path; exit 2)."""

    exit_code = ExitCode.USAGE


class TierRefused(PallasCheckError):
    """`--tier compiled` and a call the compiled tier cannot run (exit 2): the user asked
    for that tier by name, so the engine is not quietly used instead. One line, given by
    the raiser: `--tier compiled: <kernel> at <file:line> cannot run compiled: <reason>`."""

    exit_code = ExitCode.USAGE


class SchemaError(PallasCheckError, ValueError):
    """A file that is not the schema, or not a version of it, that this pallas-check reads
    (a baseline, a script's report merged by the hook; exit 2). A ValueError too: what is
    wrong is the file's content."""

    exit_code = ExitCode.USAGE


class InternalError(PallasCheckError):
    """pallas-check's own failure outside the script's run (a bug of ours, not the user's):
    one line, `internal error: TYPE: message`, exit 4 (a traceback with PALLAS_CHECK_DEBUG)."""

    exit_code = ExitCode.INTERNAL


class EngineFailure(PallasCheckError):
    """Raised inside the host callback when the engine cannot go on (reported, exit 4)."""

    exit_code = ExitCode.INTERNAL


class _RunReportLike(Protocol):
    """The run's report (report/run_report.py's RunReport, a stage above: not imported)."""

    @property
    def exit_code(self) -> int: ...


class FindingsError(PallasCheckError):
    """`Run.raise_for_findings()`: the block's pallas_calls had findings (one line each,
    `path:line: kind: kernel[buffer]: message`, in `str(error)`), or pallas-check itself
    failed. `findings` and `report` hold the data; `exit_code` is the one `pallas-check
    run` would have ended with (1 for findings, 4 for our failure)."""

    def __init__(self, message: str, findings: Sequence[object], report: _RunReportLike) -> None:
        super().__init__(message)
        self.findings = findings
        self.report = report
        self.exit_code = ExitCode(report.exit_code)


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
MAX_ERROR_CHARS = 400


def one_line(message: str) -> str:
    """An error message as one line, without object addresses (reports are reproducible)."""
    return " ".join(_ADDRESS.sub("", message).split())


def short_error(message: str) -> str:
    """One line, at most MAX_ERROR_CHARS long unless PALLAS_CHECK_DEBUG is set (an MLIR
    dump inside a JAX error can be kilobytes)."""
    line = one_line(message)
    if len(line) <= MAX_ERROR_CHARS or debug_requested():
        return line
    more = f" ... ({DEBUG_VARIABLE}=1 shows the rest)"
    short = textwrap.shorten(line, MAX_ERROR_CHARS + len(more), placeholder=more)
    # (a first word longer than the limit leaves only the placeholder: cut inside it)
    return short if short != more.lstrip() else line[:MAX_ERROR_CHARS] + more
