"""Every option of `pallas-check run` (and of `diff` and `compile`), declared once.

From this one table come: the typer command (cli.run's parameters), the
`[tool.pallas-check]` keys and `PALLAS_CHECK_*` variables with their checks (layers.py),
the pytest plugin's `--pallas-check-*` options, the Python API's keyword arguments, the
`Config` every command builds (`config_from`), and the replay command printed under each
finding (report/run_report.py). Adding an option is one entry here (and reading it where it
acts); tests/config/test_options.py proves every surface accepts every option.

The names a user types for an option are derived from its row: the flag, the settings key
(the long flag without dashes) and the environment variable (environment.py: the prefix
and the key in capitals).

Nothing here imports JAX.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
from pathlib import Path
from typing import Any, Callable, List, Mapping, Optional, TypeVar

from pallas_check.config.environment import env_variable
from pallas_check.config.model import (Config, DmaMode, Tier, TpuGeneration, UninitFill,
                                       parse_generations)
from pallas_check.config.formats import COMPILE, DIFF, RECORD, RUN, Format


# A command function that `with_options` gives its declared options.
_Command = TypeVar("_Command", bound=Callable[..., object])


@dataclasses.dataclass(frozen=True)
class Option:
    """One option: its flag(s), type, default and help, and where else it appears."""

    param: str  # the command function's parameter, e.g. "skip_floats"
    flags: tuple[str, ...]  # e.g. ("--output", "-o"); the first is the long flag
    # Its annotation, as typer reads it (bool, int, Path, str, an Enum class, Optional[...],
    # list[str]); called to convert a value where it is a plain type (commands/diff.py).
    kind: Any  # Any: a type or a typing form (Optional[...]), as typer reads it
    default: object
    help: str
    minimum: int | None = None
    config_field: str | None = None  # the Config attribute it sets, if the engine reads it
    replayed: bool = False  # the replay command repeats it when it is not the default
    pytest: bool = False  # the pytest plugin offers it as --pallas-check-<key>
    # A further check of a value (raises ValueError), e.g. `--tpu`'s list of generations.
    check: Callable[[str], object] | None = None
    # What to type, shown in --help (`--seed N`); choices show as `[a|b]`, flags as nothing.
    metavar: str | None = None
    # A flag on by default has its off switch (`--no-races`): typer's `--races/--no-races`,
    # the pytest plugin's `--pallas-check-no-races`, the replay command when it is off.
    negative: str | None = None

    @property
    def key(self) -> str:
        """The settings key and long flag without dashes, e.g. "skip-floats"."""
        return self.flags[0][2:]

    @property
    def env(self) -> str:
        """Its environment variable, e.g. PALLAS_CHECK_SKIP_FLOATS."""
        return env_variable(self.key)

    @property
    def plain_default(self) -> object:
        """The default as a report's config holds it (a choice as its text)."""
        return self.default.value if isinstance(self.default, enum.Enum) else self.default

    def switch(self, on: bool, prefix: str = "--") -> str:
        """A bool option's flag that sets it to `on` (`--races`, `--no-races`), written
        with `prefix` (`--pallas-check-` for the pytest plugin's)."""
        flag = self.flags[0] if on else self.negative
        if flag is None:
            raise ValueError(f"{self.flags[0]} has no flag that turns it off")
        return prefix + flag[2:]

    @property
    def choices(self) -> tuple[str, ...]:
        if isinstance(self.kind, type) and issubclass(self.kind, enum.Enum):
            return tuple(str(m.value) for m in self.kind)
        return ()

    @property
    def shown_metavar(self) -> str | None:
        """The help's placeholder for the value, as click writes it: `[eager|on_wait]`
        for choices, the declared word (`N`, `PATH`) otherwise; typer's own would be a
        Python type (`<int range>`, `<list[str]>`)."""
        if self.kind is bool:
            return None
        if self.choices:
            return f"[{'|'.join(self.choices)}]"
        return self.metavar


RUN_OPTIONS: tuple[Option, ...] = (
    Option("dma", ("--dma",), DmaMode, DmaMode.ON_WAIT,
           "When DMAs copy: at their start (eager), at their wait (on_wait), or at"
           " scheduler-chosen points between the two (random).",
           config_field="dma_mode", replayed=True, pytest=True),
    Option("tier", ("--tier",), Tier, Tier.AUTO,
           "Which way each checked call runs: auto (the compiled tier, one XLA computation"
           " per call, where the call is eligible; else the engine), engine (always the"
           " engine), compiled (an ineligible call is an error).",
           config_field="tier", replayed=True, pytest=True),
    Option("uninit", ("--uninit",), UninitFill, UninitFill.NAN,
           "Fill of never-written memory.", config_field="uninit", replayed=True,
           pytest=True),
    Option("skip_floats", ("--skip-floats",), bool, False,
           "Skip float-only computation (results become inf).", config_field="skip_floats",
           replayed=True),
    # `--format` of each command: the formats with a reporter for its report (formats.py).
    Option("fmt", ("--format",), Format.choices(RUN), Format.default(RUN), Format.help(RUN)),
    Option("output", ("--output", "-o"), Optional[Path], None,
           "Write the report to this file (- for stdout).", metavar="PATH"),
    Option("tpu", ("--tpu",), str, TpuGeneration.V5E.value,
           "TPU generation(s): v5e, v5p, v6e, v7x, several separated by commas. The first"
           " is the one kernels are told they run on; --compile compiles for each.",
           config_field="tpu", replayed=True, pytest=True, check=parse_generations,
           metavar="LIST"),
    Option("devices", ("--devices",), int, 1, "Number of simulated CPU devices.",
           minimum=1, config_field="devices", replayed=True, pytest=True, metavar="N"),
    Option("cores", ("--cores",), int, 1,
           "TensorCores per device; 'parallel' grid axes are split over them (megacore).",
           minimum=1, config_field="cores", replayed=True, pytest=True, metavar="N"),
    Option("seed", ("--seed",), int, 0, "Scheduler seed (replays an interleaving).",
           config_field="seed", pytest=True, metavar="N"),
    # On by default: a read of a DMA's destination before its wait is the most common
    # Pallas bug, and only the race checker sees it when the buffer already holds data.
    Option("races", ("--races",), bool, True,
           "Detect data races (happens-before); on unless --no-races.",
           config_field="races", replayed=True, pytest=True, negative="--no-races"),
    Option("schedules", ("--schedules",), int, 1,
           "Try N scheduler seeds per call (with --dma random: explore interleavings);"
           " stop at a finding.", minimum=1, config_field="schedules", pytest=True,
           metavar="N"),
    Option("keep_going", ("--keep-going",), bool, False,
           "With --schedules: try every schedule.", config_field="keep_going", pytest=True),
    Option("native", ("--native",), bool, False,
           "No simulation: run the calls on the hardware lowering (TPU or GPU) and report"
           " each call's wall time."),
    Option("trace", ("--trace",), Optional[Path], None,
           "Write the simulated run's timeline to this file as Chrome trace-event JSON"
           " (open it in ui.perfetto.dev).", metavar="PATH"),
    Option("trace_limit", ("--trace-limit",), int, 1_000_000,
           "With --trace: events recorded per call (about 100 bytes each in the file);"
           " a longer call's trace stops there and marks only its findings (0: no limit).",
           minimum=0, config_field="trace_limit", metavar="N"),
    Option("quiet_prints", ("--quiet-prints",), bool, False,
           "Drop the kernels' own prints (pl.debug_print); without it each line is"
           " prefixed with the device, core and grid point that printed it.",
           config_field="quiet_prints"),
    # Filters (intercept/call_filter.py): which calls are checked; the others run unchecked.
    Option("kernel", ("--kernel",), Optional[List[str]], None,
           "Check only the kernels whose name matches this glob (repeatable; in"
           " pyproject.toml a list); the other kernels' calls run unchecked.",
           config_field="kernels", replayed=True, pytest=True, metavar="GLOB"),
    Option("calls", ("--calls",), int, 0,
           "Check the first N calls of each kernel, shapes and static parameters; later"
           " calls run unchecked, on the fastest path that gives the same outputs (0:"
           " check every call).",
           minimum=0, config_field="calls", replayed=True, pytest=True, metavar="N"),
    # Suppressions (report/suppress.py): decided after the analysis, before the report.
    Option("ignore", ("--ignore",), Optional[List[str]], None,
           "Suppress findings of a kind in a kernel or files: KIND:KERNEL or KIND:PATH-GLOB"
           " (KIND may be *); repeatable; in pyproject.toml a list.",
           metavar="KIND:TARGET"),
    Option("baseline", ("--baseline",), Optional[Path], None,
           "Fail only on findings whose fingerprint is not in this baseline file.",
           metavar="PATH"),
    Option("update_baseline", ("--update-baseline",), bool, False,
           "With --baseline: write every current finding into the baseline file."),
    Option("compile", ("--compile",), bool, False,
           "Also compile every call for the real TPU generation(s) of --tpu with libtpu"
           " (no TPU needed): compile errors and VMEM overflows become findings.",
           config_field="compile", replayed=True, pytest=True),
    # On by default where libtpu is installed: a kernel the chip cannot build is the first
    # thing a TPU says about it (intercept/chip.py).
    Option("chip_compile", ("--chip-compile",), bool, True,
           "Compile each distinct call for the first --tpu generation as it is made, with"
           " libtpu (no TPU needed; cached across runs): what the chip refuses is a finding"
           " and raises in the program as on a TPU; on unless --no-compile (without libtpu"
           " the report says the compile was not checked).",
           config_field="chip_compile", pytest=True, negative="--no-compile"),
    Option("chip_arithmetic", ("--chip-arithmetic",), bool, True,
           "Compute as the TPU does where it differs beyond noise (measured on a v5e):"
           " float32 matrix products round their operands to bfloat16 at the default"
           " precision, in kernels and in the program's own products alike (and with"
           " --chip-functions exp and division as the chip's); --exact-arithmetic computes"
           " in float32.",
           config_field="chip_arithmetic", replayed=True, pytest=True,
           negative="--exact-arithmetic"),
    Option("chip_functions", ("--chip-functions",), bool, False,
           "With --chip-arithmetic: exp, exp2, float32 division and reciprocals and the"
           " logistic computed as the v5e computes them, bit for bit (otherwise within a"
           " few ulps; diff and replay always do); costs compile time in every program"
           " holding one.",
           config_field="chip_functions", replayed=True, pytest=True),
    Option("tpu_all", ("--tpu-all",), bool, False,
           "With several --tpu generations: the script runs once more per further"
           " generation, traced as that chip, and each run's calls are simulated and"
           " checked too (without it only the first generation's are; --compile compiles"
           " each generation's own trace either way).",
           config_field="tpu_all", replayed=True, pytest=True),
)

BY_PARAM = {option.param: option for option in RUN_OPTIONS}

# `pallas-check diff`: its own options, then those of `run` that set up our side.
DIFF_OPTIONS: tuple[Option, ...] = (
    Option("against", ("--against",), Optional[str], None,
           "The other side: native (default), hlo (JAX's HLO interpreter), jax-interpret"
           " (JAX's TPU interpreter), or options of ours in quotes, e.g. \"--uninit zero\".",
           metavar="SIDE"),
    Option("native", ("--native",), bool, False,
           "Compare against the hardware lowering (the default)."),
    Option("rtol", ("--rtol",), Optional[float], None,
           "Relative tolerance (default per dtype; f32: 1e-5, against a chip 3e-5).", minimum=0,
           metavar="FLOAT"),
    Option("atol", ("--atol",), Optional[float], None,
           "Absolute tolerance (default per dtype; f32: 1e-6, against a chip 1e-4 of its"
           " output's largest magnitude).", minimum=0,
           metavar="FLOAT"),
    *(BY_PARAM[name] for name in ("dma", "tier", "uninit", "skip_floats", "chip_arithmetic")),
    Option("fmt", ("--format",), Format.choices(DIFF), Format.default(DIFF), Format.help(DIFF)),
    *(BY_PARAM[name] for name in ("output", "devices", "tpu", "cores", "seed")),
)


# `pallas-check compile`: compile only, no simulation.
COMPILE_OPTIONS: tuple[Option, ...] = (
    Option("tpu", ("--tpu",), str, "v5e,v6e,v7x",
           "TPU generations to compile for: v5e, v5p, v6e, v7x, separated by commas.",
           check=parse_generations, metavar="LIST"),
    Option("fmt", ("--format",), Format.choices(COMPILE), Format.default(COMPILE),
           Format.help(COMPILE)),
    *(BY_PARAM[name] for name in ("output", "devices")),
)


# `pallas-check record`: the script on a TPU, every call kept in one file (the `-o`
# target, required: the report goes to stdout). No option of ours: nothing is simulated.
RECORD_OPTIONS: tuple[Option, ...] = (
    Option("output", ("--output", "-o"), Path, ...,
           "The recording to write (one .npz file; replaced atomically).",
           metavar="PATH"),
    Option("fmt", ("--format",), Format.choices(RECORD), Format.default(RECORD),
           Format.help(RECORD)),
)


# `pallas-check replay FILE`: diff's tolerances and the options of ours it takes; the other
# side is the recording.
REPLAY_OPTIONS: tuple[Option, ...] = (
    *(o for o in DIFF_OPTIONS if o.param not in ("against", "native")),
    Option("expect_findings", ("--expect-findings",), bool, False,
           "The recording is of a defect (a _bug script): ours checks as `run` does (races"
           " on), a finding where the chip ran silently is the verdict, not a disagreement,"
           " and output differences a finding about values explains are counted apart;"
           " ours finding nothing disagrees."),
)


def typer_parameters(options: tuple[Option, ...]) -> list[inspect.Parameter]:
    """The options as parameters of a typer command function."""
    import typer

    params = []
    for option in options:
        flags = option.flags
        if option.negative is not None:  # `--races/--no-races`: click's on/off pair
            flags = (f"{flags[0]}/{option.negative}", *flags[1:])
        info = typer.Option(option.default, *flags, help=option.help,
                            min=option.minimum, metavar=option.shown_metavar)
        params.append(inspect.Parameter(option.param, inspect.Parameter.KEYWORD_ONLY,
                                        default=info, annotation=option.kind))
    return params


def with_options(options: tuple[Option, ...],
                 leading: list[inspect.Parameter]) -> Callable[[_Command], _Command]:
    """Give a command function the declared options as its signature (after `leading`,
    its arguments); typer reads the signature, layers.py the declaration."""

    def decorate(fn: _Command) -> _Command:
        params = leading + typer_parameters(options)
        fn.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        fn.__annotations__ = {p.name: p.annotation for p in params}
        fn.__pallas_check_options__ = options  # type: ignore[attr-defined]
        return fn

    return decorate


def replay_options() -> tuple[Option, ...]:
    """The options a replay command repeats (when not at their default)."""
    return tuple(o for o in RUN_OPTIONS if o.replayed and o.config_field)


def config_from(values: Mapping[str, object], options: tuple[Option, ...] = RUN_OPTIONS,
                **internal: Any) -> Config:  # Any: each a Config field's own type
    """The one way a `Config` is built (`run`, `diff`, the Python API, the pytest plugin):
    from option values by parameter name (the command function's keyword arguments, or a
    settings table's), each declared option with a `config_field` that has a value setting
    that field; a choice given as its text becomes its enum member. `internal`: fields no
    option sets (`timeline`, on when `--trace` names a file)."""
    fields: dict[str, Any] = {}  # Config's fields by name, each of its own type
    for option in options:
        if option.config_field is None or option.param not in values:
            continue
        value = values[option.param]
        if isinstance(option.kind, type) and issubclass(option.kind, enum.Enum):
            value = option.kind(value)
        fields[option.config_field] = value
    return Config(**fields, **internal)
