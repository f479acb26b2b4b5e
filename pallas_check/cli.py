"""The `pallas-check` command line: options -> Config, run the script, render the report.

JAX is imported only after the options are read, because `--devices` has to reach
XLA_FLAGS before JAX starts.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import List, Optional

import typer

from pallas_check import __version__
from pallas_check.config import Config, DmaMode, TpuGeneration, UninitFill
from pallas_check.exitcodes import ExitCode

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
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
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Run a script's Pallas kernels under pallas-check's TPU interpreter."""


class Format(str):
    TABLE = "table"
    JSON = "json"


def fail(message: str, code: ExitCode = ExitCode.USAGE) -> "typer.Exit":
    """Print a one-line error to stderr and return the Exit to raise."""
    typer.echo(f"pallas-check: error: {message}", err=True)
    return typer.Exit(int(code))


def _set_device_count(devices: int) -> None:
    if devices < 1:
        raise fail("--devices must be at least 1")
    if "jax" in sys.modules:
        import jax

        if devices != 1 and len(jax.devices()) != devices:
            raise fail(f"--devices {devices}: JAX is already initialised with"
                       f" {len(jax.devices())} device(s) in this process")
        return
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    if devices > 1:
        flags.append(f"--xla_force_host_platform_device_count={devices}")
    os.environ["XLA_FLAGS"] = " ".join(flags)


def write_atomically(path: Path, text: str) -> None:
    """Write `text` to `path` so that readers never see half a report."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(path.parent))
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would surprise a CI artifact step
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# Options may follow SCRIPT (`run k.py --dma eager`); the script's own arguments go after
# `--` (`run k.py --dma eager -- --its-flag 3`), so a typo in our options is exit 2.
@app.command(context_settings={"allow_interspersed_args": True})
def run(
    script: Path = typer.Argument(..., help="The Python script to run (as __main__)."),
    script_args: Optional[List[str]] = typer.Argument(
        None, help="Arguments for the script (put them after --)."),
    dma: DmaMode = typer.Option(DmaMode.ON_WAIT, "--dma",
                                help="When DMAs copy: at start (eager) or at their wait."),
    uninit: UninitFill = typer.Option(UninitFill.NAN, "--uninit",
                                      help="Fill of never-written memory."),
    skip_floats: bool = typer.Option(False, "--skip-floats",
                                     help="Skip float-only computation (results become inf)."),
    fmt: str = typer.Option("table", "--format", help="Report format: table or json."),
    output: Optional[Path] = typer.Option(None, "--output", "-o",
                                          help="Write the report to this file."),
    devices: int = typer.Option(1, "--devices", help="Number of simulated CPU devices."),
    tpu: TpuGeneration = typer.Option(TpuGeneration.V5E, "--tpu",
                                      help="TPU generation kernels are told they run on."),
    cores: int = typer.Option(1, "--cores", min=1,
                              help="TensorCores per device; 'parallel' grid axes are split"
                                   " over them (megacore)."),
    seed: int = typer.Option(0, "--seed", help="Scheduler seed (replays an interleaving)."),
    races: bool = typer.Option(False, "--races", help="Detect data races (happens-before)."),
) -> None:
    """Run SCRIPT with every pallas_call simulated and checked; report the findings."""
    if fmt not in ("table", "json"):
        raise fail(f"unknown --format {fmt!r} (choose table or json)")
    if not script.exists():
        raise fail(f"script not found: {script}")
    if not script.is_file():
        raise fail(f"not a file: {script}")
    _set_device_count(devices)
    config = Config(dma_mode=dma, uninit=uninit, skip_floats=skip_floats, tpu=tpu,
                    devices=devices, cores=cores, seed=seed, races=races)
    from pallas_check.runner import run_and_report

    args = list(script_args or [])
    if args[:1] == ["--"]:  # `run script.py -- a b`: the `--` is ours, not the script's
        args = args[1:]
    try:
        code = run_and_report(str(script), args, config, fmt, output)
    except (typer.Exit, KeyboardInterrupt):
        raise
    except Exception as exc:  # our bug outside the script: one line, not a traceback
        if os.environ.get("PALLAS_CHECK_DEBUG"):
            raise
        raise fail(f"internal error: {type(exc).__name__}: {exc}", ExitCode.INTERNAL)
    raise typer.Exit(int(code))


def main() -> None:
    """Console-script entry point."""
    app()
