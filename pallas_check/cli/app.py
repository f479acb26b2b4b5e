"""The `pallas-check` command line: options -> Config, run the script, render the report.

JAX is imported only after the options are read, because `--devices` has to reach
XLA_FLAGS before JAX starts.
"""

from __future__ import annotations

import inspect
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Sequence

import typer
import typer.core

import pallas_check
from pallas_check import __version__
from pallas_check.process import interrupts
from pallas_check.config import TpuGeneration, parse_generations
from pallas_check.config.environment import debug_requested
from pallas_check.config import layers  # (layers.load_settings: looked up per run, tests replace it)
from pallas_check.config.layers import check_other_variables, default_map
from pallas_check.config.options import (COMPILE_OPTIONS, DIFF_OPTIONS, RECORD_OPTIONS,
                                         REPLAY_OPTIONS, RUN_OPTIONS, config_from,
                                         with_options)
from pallas_check.deliver.delivery import note
from pallas_check.config.errors import InternalError, PallasCheckError, UsageError
from pallas_check.config.exitcodes import ExitCode
from pallas_check.cli.hook import run_hook
from pallas_check.deliver.outfile import STDOUT, check_target, is_stdout, same_target, stream_descriptor
from pallas_check.config.formats import NATIVE, Format
from pallas_check.tpu_compile.toolchain import libtpu_missing, start_backends_quietly
from pallas_check.findings.units import plural
from pallas_check.process.watchdog import guard_exit

if TYPE_CHECKING:
    # The click that typer 0.29 ships (pinned in pyproject.toml): the base methods we
    # override declare its Context and HelpFormatter (`typer.Context` is a subclass, too
    # narrow for an override's parameter).
    from typer._click import Context, HelpFormatter

    from pallas_check.report.suppress import Policy

class _OneLineErrors(typer.core.TyperGroup):
    """Every way the command line can fail as one line on stderr with its documented exit
    code, never a traceback: usage errors `pallas-check: error: ...` (exit 2), a path the
    system refuses (exit 2), Ctrl-C (exit 3), a failure of ours (exit 4), and every
    `PallasCheckError` (errors.py) with the exit code it carries. Only typer's
    public API is used (`typer.TyperException` is the base of the usage errors of the
    click that typer ships; `typer.Abort` is its interrupt)."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             windows_expand_args: bool = True, **extra: object) -> object:
        try:
            code = super().main(args=args, prog_name=prog_name, complete_var=complete_var,
                                standalone_mode=False,
                                windows_expand_args=windows_expand_args, **extra)
        except (typer.Exit, SystemExit):
            raise
        except Exception as exc:
            if not standalone_mode:
                raise
            message, exit_code = _one_line(exc)
            note(message)  # (nothing when stderr is closed or its reader has gone)
            sys.exit(int(exit_code))
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)


def _one_line(exc: Exception) -> tuple[str, ExitCode]:
    """What a failure outside the script's run prints, and its exit code: the one place
    the command line maps an error to its code (ours through their base class)."""
    if isinstance(exc, typer.Abort):
        return "pallas-check: interrupted", ExitCode.USER_ERROR
    if type(exc).__name__ == "NoArgsIsHelpError":  # bare `pallas-check`: the help, as is
        return exc.format_message(), ExitCode.USAGE  # type: ignore[attr-defined]
    if isinstance(exc, typer.TyperException) and hasattr(exc, "format_message"):
        message = " ".join(exc.format_message().split())
        return f"pallas-check: error: {message}", ExitCode.USAGE
    if isinstance(exc, PallasCheckError):
        return f"pallas-check: error: {exc}", exc.exit_code
    if getattr(exc, "pallas_check_error", False):  # below errors.py: jaxbridge/version.py
        return f"pallas-check: error: {exc}", ExitCode(getattr(exc, "exit_code"))
    if isinstance(exc, OSError):  # a path given on the command line or in the config
        name = str(exc.filename or "")
        if len(name) > 80:  # a path has no spaces to shorten at: keep both ends
            name = f"{name[:38]}...{name[-38:]}"
        where = f"{name}: " if name else ""
        return f"pallas-check: error: {where}{exc.strerror or exc}", ExitCode.USAGE
    if debug_requested():
        raise exc
    text = " ".join(str(exc).split())
    return (f"pallas-check: error: internal error: {type(exc).__name__}: {text}",
            ExitCode.INTERNAL)


class _Command(typer.core.TyperCommand):
    """A command whose arguments are shown as what to type, the way click shows them:
    `SCRIPT [ARGS]...` in the usage line and `SCRIPT` in the list (typer's own would be
    `{script} [script_args]...` and `script <path>`, `script_args... <list[str]>`)."""

    def collect_usage_pieces(self, ctx: Context) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, typer.core.TyperArgument):
                name = _operand(param)
                pieces.append((name if param.required else f"[{name}]")
                              + ("..." if param.nargs != 1 else ""))
            else:
                pieces.extend(param.get_usage_pieces(ctx))
        return pieces

    def format_options(self, ctx: Context, formatter: HelpFormatter) -> None:
        arguments, options = [], []
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if isinstance(param, typer.core.TyperArgument):
                name = _operand(param) + ("..." if param.nargs != 1 else "")
                arguments.append((name, record[1]))
            else:
                options.append(record)
        for title, records in (("Arguments", arguments), ("Options", options)):
            if records:
                with formatter.section(title):
                    formatter.write_dl(records)


def _operand(param: typer.core.TyperArgument) -> str:
    return param.metavar or param.name.upper()


app = typer.Typer(
    cls=_OneLineErrors,
    add_completion=True,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Debugger and race-checker for JAX Pallas TPU kernels, run on a CPU.",
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"pallas-check {__version__}")
        raise typer.Exit(int(ExitCode.CLEAN))


@app.callback()
def _main(
    ctx: typer.Context,
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Run a script's Pallas kernels under pallas-check's TPU interpreter."""
    check_other_variables()  # PALLAS_CHECK_DEBUG=maybe: one line, exit 2, every command
    if ctx.invoked_subcommand == "run":
        # [tool.pallas-check] and PALLAS_CHECK_* become run's defaults; given flags win
        # (a bad table or variable is a SettingsError: one line, exit 2).
        ctx.default_map = {"run": default_map(layers.load_settings(run))}


def _check_output(output: Optional[Path], script: Path,
                  flag: str = "--output") -> Optional[Path]:
    """A bad --output is a usage error before the run, not a lost report after it. The
    path is made absolute now: a script that changes directory does not move the report."""
    if output is None:
        return None
    check_target(output, script, flag)
    return output if is_stdout(output) else Path(os.path.abspath(output))


def _refuse_collisions(targets: list[tuple[str, Optional[Path]]]) -> None:
    """Two of the files a run writes (or a baseline it reads, that another would then
    overwrite) named as one place: the second would silently replace the first, or both
    be interleaved in one stream. A usage error before the run. No --output is stdout."""
    named = [(flag, path if path is not None else Path(STDOUT))
             for flag, path in targets if path is not None or flag == "--output"]
    for i, (flag, path) in enumerate(named):
        for other_flag, other in named[i + 1:]:
            if not same_target(path, other):
                continue
            first = (f"{flag} {path}" if dict(targets)[flag] is not None
                     else "the report (stdout)")
            if is_stdout(path) or stream_descriptor(path) is not None:
                why = "the same stream: two reports would be interleaved in it"
            else:
                why = "the same file: one would overwrite the other"
            raise fail(f"{first} and {other_flag} {other} are {why}")


def _suppression_policy(ignore: Optional[List[str]], baseline: Optional[Path],
                        update_baseline: bool, races: bool, script: Path) -> Policy:
    """Suppressions (report/suppress.py) checked before the run: a bad entry or baseline, or a
    baseline that cannot be written, is exit 2 before any work is lost."""
    from pallas_check.report.suppress import make_policy  # lazy: it brings report.model, no part of --help

    if update_baseline and baseline is not None:
        check_target(baseline, script, "--baseline")
    return make_policy(ignore, baseline, update_baseline, races)


def fail(message: str) -> UsageError:
    """The usage error to raise: one line on stderr, exit 2 (`_one_line`)."""
    return UsageError(message)


def _set_device_count(devices: int) -> None:
    if devices < 1:
        raise fail("--devices must be at least 1")
    if "jax" in sys.modules:  # (a process that runs several commands: the tests)
        import jax  # (imported already: this loads nothing)

        if devices != 1 and len(jax.devices()) != devices:
            raise fail(f"--devices {devices}: JAX is already initialised with"
                       f" {plural(len(jax.devices()), 'device')} in this process")
        return
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    if devices > 1:
        flags.append(f"--xla_force_host_platform_device_count={devices}")
    os.environ["XLA_FLAGS"] = " ".join(flags)


# Options may follow SCRIPT (`run k.py --dma eager`); the script's own arguments go after
# `--` (`run k.py --dma eager -- --its-flag 3`), so a typo in our options is exit 2.
# The options themselves are declared once, in options.py.
_SCRIPT_PARAMETERS = [
    inspect.Parameter("script", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Path,
                      default=typer.Argument(..., metavar="SCRIPT",
                                             help="The Python script to run (as"
                                                  " __main__).")),
    inspect.Parameter("script_args", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                      annotation=Optional[List[str]],
                      default=typer.Argument(None, metavar="ARGS",
                                             help="Arguments for the script (put them"
                                                  " after --).")),
]


@app.command(cls=_Command, context_settings={"allow_interspersed_args": True})
@with_options(RUN_OPTIONS, _SCRIPT_PARAMETERS)
def run(script: Path, script_args: Optional[List[str]] = None,
        **options: Any) -> None:  # Any: each option's own type, set by typer at run time
    """Run SCRIPT with every pallas_call simulated and checked; report the findings."""
    # `options`: every option of RUN_OPTIONS by parameter name (typer reads the signature
    # with_options gives this function); those the engine reads become the Config.
    fmt_name = Format(options["fmt"]).value
    output, trace, baseline = options["output"], options["trace"], options["baseline"]
    if not script.exists():
        raise fail(f"script not found: {script}")
    if not script.is_file():
        raise fail(f"not a file: {script}")
    _generations(options["tpu"], options["compile"])
    if trace is not None and str(trace) == "-":
        raise fail("--trace needs a file (stdout is the report's)")
    _refuse_collisions([("--output", output), ("--trace", trace), ("--baseline", baseline)])
    output = _check_output(output, script)
    policy = _suppression_policy(options["ignore"], baseline, options["update_baseline"],
                                 options["races"], script)
    trace = _check_output(trace, script, "--trace")
    _set_device_count(options["devices"])
    _start_the_run(options["compile"] or options["chip_compile"])
    if options["native"]:
        _run_native(script, script_args, fmt_name, output)
    config = config_from(options, RUN_OPTIONS, timeline=trace is not None)
    args = _script_args(script_args)
    raise _guarded(lambda: pallas_check.run.runner.run_and_report(str(script), args, config,
                                                              fmt_name, output, policy, trace))


@app.command(cls=_Command)
def hook(
    files: Optional[List[str]] = typer.Argument(
        None, metavar="FILES",
        help="Files pre-commit passes; every configured script is checked."),
) -> None:
    """Check the scripts [tool.pallas-check] names, each in its own process (pre-commit)."""
    raise typer.Exit(int(run_hook(files or [])))


def _generations(tpu: str, compiling: bool) -> tuple[TpuGeneration, ...]:
    """`--tpu` checked (one line, exit 2); with --compile, libtpu must be installed."""
    try:
        generations = parse_generations(tpu)
    except ValueError as exc:
        raise fail(str(exc)) from None
    if compiling:
        missing = libtpu_missing()
        if missing:
            raise fail(missing)
    return generations


def _start_the_run(compiling: bool = False) -> None:
    """The one place the command line imports the run (run/runner.py and the commands, and
    with them JAX, numpy, rich and the reporters): after the options are read, so that
    `--help` and every usage error answer without them, and after `--devices` is in
    XLA_FLAGS. Then JAX's backends are started, libtpu's start-up chatter kept off the
    terminal. A Ctrl-C meanwhile stops the run before the script (process/interrupts.py)."""
    with interrupts.handled():
        # Used as pallas_check.run.runner, ...: the package holds them once imported.
        import pallas_check.commands.compile, pallas_check.commands.diff, pallas_check.commands.sides, pallas_check.commands.native, pallas_check.commands.record, pallas_check.commands.replay, pallas_check.run.runner  # noqa: E401 lazy: JAX after XLA_FLAGS

        start_backends_quietly(compiling)


@app.command(name="compile", cls=_Command,
             context_settings={"allow_interspersed_args": True})
@with_options(COMPILE_OPTIONS, _SCRIPT_PARAMETERS)
def compile_only(script: Path, script_args: Optional[List[str]] = None, *, tpu: str,
                 fmt: Format, output: Optional[Path], devices: int) -> None:
    """Compile every pallas_call of SCRIPT for real TPUs (libtpu, no TPU, no simulation):
    a table of calls x generations."""
    fmt_name = Format(fmt).value  # only the formats compile's report has (formats.py)
    if not script.exists():
        raise fail(f"script not found: {script}")
    if not script.is_file():
        raise fail(f"not a file: {script}")
    generations = _generations(tpu, compiling=True)
    output = _check_output(output, script)
    _set_device_count(devices)
    _start_the_run(compiling=True)
    args = _script_args(script_args)
    command = pallas_check.commands.compile.CompileOnlyCommand(str(script), generations, args,
                                                              devices)
    raise _guarded(lambda: pallas_check.run.runner.run_command(command, str(script), args,
                                                           fmt_name, output))


def _script_args(script_args: Optional[List[str]]) -> list[str]:
    # click has taken the `--` that ends our options; a second one is the script's own.
    return list(script_args or [])


def _guarded(call: Callable[[], ExitCode]) -> "typer.Exit":
    """Run `call()` (which returns an ExitCode); our own failure is one line, exit 4 (a
    PallasCheckError goes on to `_one_line` with the code it carries)."""
    try:
        code = call()
    except (typer.Exit, KeyboardInterrupt, PallasCheckError):
        raise
    except Exception as exc:  # our bug outside the script: one line, not a traceback
        if debug_requested():
            raise
        raise InternalError(f"internal error: {type(exc).__name__}: {exc}") from exc
    return typer.Exit(int(code))


def _run_native(script: Path, script_args: Optional[List[str]], fmt: str,
                output: Optional[Path]) -> None:
    """`run --native`: no simulation; the calls on the hardware, each one timed."""
    accepted = Format.accepted_by(NATIVE)
    if Format(fmt) not in accepted:
        raise fail(f"--native reports as {' or '.join(f.value for f in accepted)},"
                   f" not {fmt!r}")
    reason = pallas_check.commands.native.native_unavailable()
    if reason:
        raise fail(reason)
    raise _guarded(lambda: pallas_check.commands.native.run_native_and_report(
        str(script), _script_args(script_args), fmt, output))


@app.command(cls=_Command, context_settings={"allow_interspersed_args": True})
@with_options(DIFF_OPTIONS, _SCRIPT_PARAMETERS)
def diff(script: Path, script_args: Optional[List[str]] = None,
        **options: Any) -> None:  # Any: each option's own type, set by typer at run time
    """Run every pallas_call of SCRIPT twice (ours and another side); compare the outputs."""
    fmt = Format(options["fmt"]).value  # only the formats diff's report has (formats.py)
    against, output = options["against"], options["output"]
    if options["native"] and against not in (None, "native"):
        raise fail(f"--native and --against {against!r} name two different other sides")
    if not script.exists():
        raise fail(f"script not found: {script}")
    if not script.is_file():
        raise fail(f"not a file: {script}")
    _generations(options["tpu"], False)
    output = _check_output(output, script)
    _set_device_count(options["devices"])
    _start_the_run()
    # diff compares outputs, which race detection does not change: it stays off on our
    # side (as before races became `run`'s default); `--against "--races"` turns it on.
    config = config_from(options, DIFF_OPTIONS, races=False)
    compare = pallas_check.commands.diff
    # a bad --against: a UsageError, exit 2
    side = pallas_check.commands.sides.parse_against(against, config)
    if side.native:
        reason = pallas_check.commands.native.native_unavailable()
        if reason:
            raise fail(reason)
    tolerance = compare.Tolerance(options["rtol"], options["atol"])
    raise _guarded(lambda: compare.run_diff_and_report(str(script), _script_args(script_args),
                                                       config, side, tolerance, fmt, output))


@app.command(cls=_Command, context_settings={"allow_interspersed_args": True})
@with_options(RECORD_OPTIONS, _SCRIPT_PARAMETERS)
def record(script: Path, script_args: Optional[List[str]] = None, *, output: Path,
           fmt: Format) -> None:
    """Run SCRIPT on a TPU; keep every pallas_call's operands and the chip's outputs in one
    file (-o) that `pallas-check replay` checks the simulation against on any CPU."""
    fmt_name = Format(fmt).value  # only the formats record's report has (formats.py)
    if not script.exists():
        raise fail(f"script not found: {script}")
    if not script.is_file():
        raise fail(f"not a file: {script}")
    if is_stdout(output) or stream_descriptor(output) is not None:
        raise fail(f"--output {output}: a recording is a file (the report goes to stdout)")
    target = _check_output(output, script)
    assert target is not None  # (a path given: never None)
    _start_the_run()
    recorder = pallas_check.commands.record
    reason = recorder.record_unavailable()
    if reason:
        raise fail(reason)
    raise _guarded(lambda: recorder.run_record_and_report(
        str(script), _script_args(script_args), target, fmt_name))


_RECORDING_PARAMETERS = [
    inspect.Parameter("recording", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Path,
                      default=typer.Argument(..., metavar="FILE",
                                             help="A recording `pallas-check record`"
                                                  " wrote.")),
]


@app.command(cls=_Command, context_settings={"allow_interspersed_args": True})
@with_options(REPLAY_OPTIONS, _RECORDING_PARAMETERS)
def replay(recording: Path, **options: Any) -> None:  # Any: each option's own type
    """Run a recording's script under the simulation, each pallas_call on the recorded
    operands; compare with the chip's recorded outputs (exit 1 on a disagreement)."""
    fmt = Format(options["fmt"]).value  # the formats diff's report has (formats.py)
    if not recording.exists():
        raise fail(f"recording not found: {recording}")
    if not recording.is_file():
        raise fail(f"not a file: {recording}")
    _generations(options["tpu"], False)
    output = _check_output(options["output"], recording)
    _set_device_count(options["devices"])
    _start_the_run(True)  # the chip's compile at each call (below)
    replaying = pallas_check.commands.replay
    made = replaying.load(recording)  # not a recording, or its script not here: exit 2
    expect = bool(options["expect_findings"])
    # The recording's chip, its compile checked at each call (replay.chip_config). A
    # defect's recording is checked as `run` checks (races on); otherwise races, which
    # change no output, stay off.
    config = replaying.chip_config(made, config_from(options, REPLAY_OPTIONS, races=expect))
    tolerance = pallas_check.commands.diff.Tolerance(options["rtol"], options["atol"])
    raise _guarded(lambda: replaying.run_replay_and_report(recording, made, config, tolerance,
                                                           fmt, output, expect))


def main() -> None:
    """Console-script entry point. Once the report is out, the process ends even if the
    script left JAX computations that never finish (JAX's exit handler waits for them)."""
    interrupts.install()  # SIGTERM (CI, `timeout`) stops a run as Ctrl-C does
    try:
        app(prog_name="pallas-check")  # `python -m pallas_check` is the same program
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        guard_exit(code)
        raise
