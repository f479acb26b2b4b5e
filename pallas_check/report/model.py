"""What a reporter is given: the findings and the facts of the run, nothing live."""

from __future__ import annotations

import dataclasses
import shlex
from typing import Any

from pallas_check.findings import CallSummary, Finding
from pallas_check.options import RUN_OPTIONS, replay_options


@dataclasses.dataclass
class RunReport:
    script: str
    config: dict[str, Any]
    findings: list[Finding]
    calls: list[CallSummary]
    exit_code: int
    user_error: str | None = None
    user_traceback: str | None = None
    internal_error: str | None = None
    partial: bool = False
    # How to run the same thing again: "pallas-check run SCRIPT" for the CLI; the pytest
    # plugin sets "pytest NODEID --pallas-check".
    rerun: str | None = None
    script_args: tuple[str, ...] = ()  # what followed `--` on the command line


# Options that change what a simulation does (options.py marks them), with their defaults:
# a replay names those that differ, plus the seed.
_REPLAY_OPTIONS = replay_options()


def replay_command(script: str, config: dict[str, Any], seed: int | None,
                   rerun: str | None = None, script_args: tuple[str, ...] = ()) -> str:
    """The command that reproduces a finding: same options, the finding's seed."""
    seed = seed if seed is not None else config.get("seed", 0)
    if rerun is not None and not rerun.startswith("pallas-check"):
        # Under pytest the options are the plugin's; name them as such (the others come
        # from [tool.pallas-check], which the rerun reads again).
        flags = ""
        for option in RUN_OPTIONS:
            if not option.pytest or option.config_field is None:
                continue
            default = getattr(option.default, "value", option.default)
            value = config.get(option.config_field, default)
            if value != default:
                flag = f"--pallas-check-{option.key}"
                flags += f" {flag}" if option.kind is bool else f" {flag} {value}"
        return f"{rerun}{flags} (seed {seed})"
    parts = [rerun or f"pallas-check run {shlex.quote(script)}"]
    for key, flag, default in _REPLAY_OPTIONS:
        value = config.get(key, default)
        if value == default:
            continue
        parts.append(flag if isinstance(value, bool) else f"{flag} {value}")
    parts.append(f"--seed {seed}")
    if script_args:
        parts.append("-- " + " ".join(shlex.quote(a) for a in script_args))
    return " ".join(parts)
