"""What a reporter is given: the findings and the facts of the run, nothing live."""

from __future__ import annotations

import dataclasses
import shlex
from typing import Mapping

from pallas_check.findings.finding import CallSummary, Finding, JsonObject, JsonValue
from pallas_check.findings.units import plural
from pallas_check.config.options import Option, replay_options


@dataclasses.dataclass(frozen=True)
class Suppression:
    """Why a finding is not counted (report/suppress.py decides; reporters say so)."""

    by: str  # "inline", "def-line", "config" or "baseline"
    where: str  # "file:line" of the comment, the config entry, or the baseline file

    @property
    def in_source(self) -> bool:
        """A comment in the code (SARIF `inSource`), not a file beside it (`external`)."""
        return self.by in ("inline", "def-line")

    def describe(self) -> str:
        return f"{self.by} ({self.where})"


@dataclasses.dataclass
class RunReport:
    script: str
    config: JsonObject  # the run's Config, as its JSON report writes it
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
    # Findings suppressed (report/suppress.py), with what suppressed each; `findings` are the rest.
    suppressed: list[tuple[Finding, Suppression]] = dataclasses.field(default_factory=list)
    trace: str | None = None  # the --trace file written, if any
    trace_notes: list[str] = dataclasses.field(default_factory=list)  # capped calls
    # What the run could not check, said once (the TPU compile without libtpu).
    notes: list[str] = dataclasses.field(default_factory=list)
    # --kernel / --calls: the calls run unchecked, per kernel name (intercept/call_filter.py).
    passed_through: dict[str, int] = dataclasses.field(default_factory=dict)
    # Several --tpu generations with --compile or --tpu-all: per further generation, how
    # its calls were traced (intercept/generations.py): by a run of the script of its own (calls,
    # findings, the script's error, seconds), or from the first generation's trace.
    traces: dict[str, JsonObject] = dataclasses.field(default_factory=dict)


def kernel_counts(report: RunReport) -> list[tuple[str, int, int]]:
    """(kernel, calls checked, calls passed through) per kernel name, sorted by name."""
    checked: dict[str, int] = {}
    for call in report.calls:
        checked[call.kernel] = checked.get(call.kernel, 0) + 1
    names = sorted({*checked, *report.passed_through})
    return [(name, checked.get(name, 0), report.passed_through.get(name, 0))
            for name in names]


# The ways a checked call runs (CallSummary.tier), in the order reports list them.
TIERS = ("engine", "compiled")


def tier_counts(report: RunReport) -> dict[str, int]:
    """How many of the report's calls each tier ran: both tiers always present (a reader
    never has to ask whether a missing key means none), any other after them."""
    counts = dict.fromkeys(TIERS, 0)
    for call in report.calls:
        tier = getattr(call, "tier", "engine")
        counts[tier] = counts.get(tier, 0) + 1
    return counts


def tiers_text(report: RunReport) -> str:
    """`3 of 5 calls ran compiled (one XLA computation each); 2 on the engine`, or "" when
    no call ran compiled: said only where the compiled tier ran something, so a run that
    is all engine reads as it always did."""
    counts = tier_counts(report)
    compiled = counts["compiled"]
    if not compiled:
        return ""
    total = sum(counts.values())
    text = f"{compiled} of {plural(total, 'call')} ran compiled (one XLA computation each)"
    others = total - compiled
    return text + (f"; {others} on the engine" if others else "")


SUPPRESSED_BY = ("inline", "def-line", "config", "baseline")  # the order reports list them


def suppressed_counts(report: RunReport) -> dict[str, int]:
    """How many findings each way of suppressing took (inline, def-line, config, baseline)."""
    counts = {by: 0 for by in SUPPRESSED_BY}
    for _, why in report.suppressed:
        counts[why.by] = counts.get(why.by, 0) + 1
    return {by: n for by, n in counts.items() if n}


def suppressed_text(report: RunReport) -> str:
    """`3 suppressed (inline 2, baseline 1)`, or "" when nothing was."""
    counts = suppressed_counts(report)
    if not counts:
        return ""
    parts = ", ".join(f"{by} {n}" for by, n in counts.items())
    return f"{sum(counts.values())} suppressed ({parts})"


# The `rerun` of a report made by the Python API: its replay is a `checking(...)` call.
API_RERUN = "pallas_check.checking"

# Options that change what a simulation does (options.py marks them), with their defaults:
# a replay names those that differ, plus the seed.
_REPLAY_OPTIONS = replay_options()


def replay_command(script: str, config: Mapping[str, JsonValue], seed: int | None,
                   rerun: str | None = None, script_args: tuple[str, ...] = ()) -> str:
    """The command that reproduces a finding: same options, the finding's seed."""
    shown_seed = seed if seed is not None else config.get("seed", 0)
    if rerun == API_RERUN:  # the Python API (api.py): the block's options, this seed
        args = [f"{o.key.replace('-', '_')}={value!r}" for o in _REPLAY_OPTIONS
                if (value := _configured(config, o)) != o.plain_default]
        return f"{API_RERUN}({', '.join([*args, f'seed={shown_seed}'])})"
    if rerun is not None and not rerun.startswith("pallas-check"):
        # Under pytest the options are the plugin's; name them as such (the others come
        # from [tool.pallas-check], which the rerun reads again), the seed last.
        flags = "".join(_flag_text(o, value, "--pallas-check-") for o in _REPLAY_OPTIONS
                        if o.pytest and (value := _configured(config, o))
                        != o.plain_default)
        return f"{rerun}{flags} --pallas-check-seed {shown_seed}"
    parts = [rerun or f"pallas-check run {shlex.quote(script)}"]
    for option in _REPLAY_OPTIONS:
        value = _configured(config, option)
        if value != option.plain_default:
            parts.append(_flag_text(option, value).lstrip())
    parts.append(f"--seed {shown_seed}")
    if script_args:
        parts.append("-- " + " ".join(shlex.quote(a) for a in script_args))
    return " ".join(parts)


def _configured(config: Mapping[str, JsonValue], option: Option) -> object:
    """The option's value in a run's config (a replayed option always has a config field)."""
    assert option.config_field is not None  # replay_options() keeps only those
    return config.get(option.config_field, option.plain_default)


def _flag_text(option: Option, value: object, prefix: str = "--") -> str:
    """` --races` or ` --no-races`, ` --dma eager`, or a list's flag once per item
    (` --kernel 'mat*' --kernel sgd`: quoted, so that the shell hands a glob on
    unexpanded); `prefix`: `--pallas-check-` for the pytest plugin's flags."""
    flag = prefix + option.flags[0][2:]
    if isinstance(value, bool):
        return f" {option.switch(value, prefix)}"
    if isinstance(value, (list, tuple)):
        return "".join(f" {flag} {shlex.quote(str(item))}" for item in value)
    return f" {flag} {value}"
