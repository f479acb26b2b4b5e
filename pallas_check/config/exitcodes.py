"""Exit codes of the `pallas-check` command, named once here (documented in docs/output.md)."""

from collections.abc import Iterable
from enum import IntEnum


class ExitCode(IntEnum):
    """What a run of pallas-check ended with; CI and pre-commit hooks read these."""

    CLEAN = 0  # the script ran and no finding was reported
    FINDINGS = 1  # the script ran and at least one finding was reported
    USAGE = 2  # bad command line or configuration
    USER_ERROR = 3  # the user's script raised or exited non-zero
    INTERNAL = 4  # pallas-check itself failed (or met a primitive it does not support)
    NO_CALLS = 5  # the script ran cleanly but made no pallas_call (pytest's "no tests")


# From least to most serious: what `worst` picks among several runs (the hook's scripts).
# A script that checked nothing outranks a clean one but not one with findings.
_SEVERITY = (ExitCode.CLEAN, ExitCode.NO_CALLS, ExitCode.FINDINGS, ExitCode.USAGE,
             ExitCode.USER_ERROR, ExitCode.INTERNAL)


def worst(codes: Iterable[int]) -> ExitCode:
    """The most serious of several exit codes (CLEAN for none)."""
    return max((ExitCode(c) for c in codes), key=_SEVERITY.index, default=ExitCode.CLEAN)


def exit_code_for(problems: int, user_failed: bool, tool_failed: bool,
                  calls: int | None = None) -> ExitCode:
    """The one ranking of a run's outcome: our failure (or the other side's, for diff)
    outranks the user's; the user's outranks findings (or mismatches); a run that checked
    no pallas_call (`calls == 0`) is NO_CALLS, so that a misconfigured CI job is not green."""
    if tool_failed:
        return ExitCode.INTERNAL
    if user_failed:
        return ExitCode.USER_ERROR
    if problems:
        return ExitCode.FINDINGS
    return ExitCode.NO_CALLS if calls == 0 else ExitCode.CLEAN
