"""What a reporter is given: the findings and the facts of the run, nothing live."""

from __future__ import annotations

import dataclasses
import shlex
from typing import Any

from pallas_check.findings import CallSummary, Finding


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


# Options that change what a simulation does, with their defaults: a replay names those
# that differ, plus the seed.
_REPLAY_OPTIONS = (
    ("dma_mode", "--dma", "on_wait"),
    ("uninit", "--uninit", "nan"),
    ("skip_floats", "--skip-floats", False),
    ("tpu", "--tpu", "v5e"),
    ("devices", "--devices", 1),
    ("cores", "--cores", 1),
    ("races", "--races", False),
)


def replay_command(script: str, config: dict[str, Any], seed: int | None,
                   rerun: str | None = None, script_args: tuple[str, ...] = ()) -> str:
    """The command that reproduces a finding: same options, the finding's seed."""
    seed = seed if seed is not None else config.get("seed", 0)
    if rerun is not None and not rerun.startswith("pallas-check"):
        # Under pytest the options are the plugin's; name them as such (the others come
        # from [tool.pallas-check], which the rerun reads again).
        flags = " --pallas-check-races" if config.get("races") else ""
        for key, flag in (("dma_mode", "--pallas-check-dma"), ("uninit", "--pallas-check-uninit")):
            default = dict((k, d) for k, _, d in _REPLAY_OPTIONS)[key]
            if config.get(key, default) != default:
                flags += f" {flag} {config[key]}"
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
