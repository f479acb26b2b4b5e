"""Exit codes of the `pallas-check` command, named once here and documented in README."""

from enum import IntEnum


class ExitCode(IntEnum):
    """What a run of pallas-check ended with; CI and pre-commit hooks read these."""

    CLEAN = 0  # the script ran and no finding was reported
    FINDINGS = 1  # the script ran and at least one finding was reported
    USAGE = 2  # bad command line or configuration
    USER_ERROR = 3  # the user's script raised or exited non-zero
    INTERNAL = 4  # pallas-check itself failed (or met a primitive it does not support)


def exit_code_for(problems: int, user_failed: bool, tool_failed: bool) -> ExitCode:
    """The one ranking of a run's outcome: our failure (or the other side's, for diff)
    outranks the user's; the user's outranks findings (or mismatches)."""
    if tool_failed:
        return ExitCode.INTERNAL
    if user_failed:
        return ExitCode.USER_ERROR
    return ExitCode.FINDINGS if problems else ExitCode.CLEAN
