"""pytest plugin: `pytest --pallas-check` checks every pallas_call a test makes.

Registered as the `pallas_check` entry point of `pytest11`, so it is loaded wherever
pallas-check is installed, and does nothing unless `--pallas-check` is given (it imports
neither JAX nor the engine before that). With it, each test's call phase runs inside the
Python API's block (api.py `checked`: the run path of `pallas-check run`): findings fail
the test, with the table report as the failure text; a test that failed on its own keeps
its failure and gets the table as an extra report section.
`@pytest.mark.pallas_check_skip` runs a test without interception.

The simulated TPU (`--pallas-check-tpu GEN`, default v5e) answers for the whole session,
from before collection: a TPU-only suite's module-level `skipif` on the device kind, its
fixtures and its wrappers all see that chip (intercept/tpu_info.py), while XLA runs on the CPU.
With several generations, `--pallas-check-compile` runs a test that asked which chip it runs
on again in-process as each further one and compiles that run (intercept/generations.py);
`--pallas-check-tpu-all` checks those runs too.

Options: `--pallas-check-<key>` for each option of `run` that means something in a test
session (options.py marks them `pytest=True`: dma, tier, uninit, tpu, devices, cores, seed,
races / `--pallas-check-no-races`, schedules, keep-going, kernel, calls, compile), with
the help of `run`, flags named as the plugin's; the other settings of
`[tool.pallas-check]` in the pyproject.toml found from pytest's rootdir (and
`PALLAS_CHECK_*` variables) apply too, with these flags over them.
`--pallas-check-devices N` sets the CPU device count before the tests start JAX (a usage
error if JAX already runs with another). One session per test and per process, so
pytest-xdist (`-n N`) needs nothing more. The replay line under a finding is a pytest
command: the test's node id, the plugin's flags, `--pallas-check-seed N`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import re
import shlex
import subprocess
import sys
from typing import TYPE_CHECKING, Callable, Generator, cast

import pytest

import pallas_check
from pallas_check.run.api_options import Options, resolve  # plain data: no JAX imported
from pallas_check.config import Config, TpuGeneration
from pallas_check.config.layers import checked_value, option_specs
from pallas_check.config.options import RUN_OPTIONS
from pallas_check.config.errors import one_line
from pallas_check.config.exitcodes import ExitCode
from pallas_check.tpu_compile.toolchain import (NOT_CHECKED, libtpu_missing, quiet_environment,
                                                start_backends_quietly)
from pallas_check.findings.units import plural

if TYPE_CHECKING:
    from pallas_check.intercept.generations import GenerationRun

PYTEST_OPTIONS = tuple(option for option in RUN_OPTIONS if option.pytest)

MARKER = "pallas_check_skip"
SECTION = "pallas-check"

_OPTIONS_KEY: "pytest.StashKey[Options]" = pytest.StashKey()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pallas-check", "pallas-check: check Pallas kernels on CPU")
    group.addoption("--pallas-check", action="store_true", default=False,
                    help="Run each test with every pallas_call simulated and checked by"
                         " pallas-check; findings fail the test.")
    group.addoption("--pallas-check-replay", action="store_true", default=False,
                    help="Collect each hardware recording (`pallas-check record`, *.npz) in"
                         " the folders pytest collects as a test that replays it on the CPU"
                         " (`pallas-check replay`); a disagreement with the chip fails it.")
    for option in PYTEST_OPTIONS:  # declared in options.py
        name, dest = plugin_flag(option.flags[0]), f"pallas_check_{option.param}"
        text = plugin_help(option.help)
        if option.kind is bool:
            group.addoption(name, action="store_true", default=None, dest=dest, help=text)
            if option.negative is not None:  # --pallas-check-no-races
                group.addoption(plugin_flag(option.negative), action="store_false",
                                default=None, dest=dest, help=f"Turn {name} off.")
        elif "List" in str(option.kind):  # repeatable, e.g. --pallas-check-kernel
            group.addoption(name, action="append", default=None, dest=dest, help=text,
                            metavar=option.metavar)
        else:
            group.addoption(name, choices=option.choices or None, default=None, dest=dest,
                            help=text, metavar=None if option.choices else option.metavar)


def plugin_flag(flag: str) -> str:
    """`--dma` of `run` as the plugin's `--pallas-check-dma`."""
    return f"--pallas-check-{flag[2:]}"


_PLUGIN_FLAGS = {flag for o in PYTEST_OPTIONS for flag in (o.flags[0], o.negative) if flag}
_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z-]*[a-z]")


def plugin_help(text: str) -> str:
    """An option's help of `run` as the plugin shows it: each flag the plugin has named as
    the plugin's (`--compile` ... `of --tpu`: `--pallas-check-tpu`), so that the help never
    sends a user to a flag pytest does not take (tests/api checks none is left)."""
    return _FLAG.sub(lambda m: plugin_flag(m.group(0)) if m.group(0) in _PLUGIN_FLAGS
                     else m.group(0), text)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}: run this test without pallas-check's interception.")
    if config.getoption("pallas_check"):
        config.pluginmanager.register(_CallCounter(), "pallas-check-call-counter")
        config.stash[_OPTIONS_KEY] = options = _options(config)
        if options.config.compile:
            missing = libtpu_missing()
            if missing:
                raise pytest.UsageError(f"pallas-check: {missing}")
            quiet_environment(compiling=True)  # before libtpu loads
        elif options.config.chip_compile and libtpu_missing() is None:
            quiet_environment(compiling=True)  # each call compiled as it is made
        if config.getoption("pallas_check_devices") is not None:
            _use_devices(options.config.devices,
                         options.config.compile or options.config.chip_compile)
        # Used as pallas_check.api, ...: the package holds them once imported.
        import pallas_check.api, pallas_check.commands.retrace, pallas_check.intercept.tpu_info, pallas_check.run.runner  # noqa: E401 lazy: JAX after XLA_FLAGS

        _simulate_the_tpu(config, options.config)


def _simulate_the_tpu(config: pytest.Config, check: Config) -> None:
    """The simulated TPU (intercept/tpu_info.py) for the whole session, from before collection to
    the end: a TPU-only suite's module-level `skipif(no TPU device)`, its fixtures and
    its wrappers ask which chip they run on before any test's pallas_call, and are told
    `tpu` (the first generation) as each test's own checking is."""
    stack = contextlib.ExitStack()
    stack.enter_context(pallas_check.intercept.tpu_info.simulated_tpu(check.tpu, check.cores))
    config.add_cleanup(stack.close)


def _options(config: pytest.Config) -> Options:
    """The Python API's options (api.py): defaults < [tool.pallas-check] of the rootdir's
    pyproject < PALLAS_CHECK_* < these flags. `ignore` and `baseline` apply (inline
    comments always do); one test rarely runs every path of a kernel, so unused comments
    are not reported here. The device count is the flag's alone (`devices` of the table
    is for `run`: a test suite may set up JAX's devices itself)."""
    flags = {option.key.replace("-", "_"): config.getoption(f"pallas_check_{option.param}")
             for option in PYTEST_OPTIONS}
    devices = flags.pop("devices")
    try:
        options = resolve({k: v for k, v in flags.items() if v is not None},
                          project=config.rootpath, report_unused=False)
    except ValueError as exc:
        raise pytest.UsageError(f"pallas-check: {exc}") from None
    if devices is None:
        return options
    try:
        count = checked_value(  # (an int: the option's check made it one)
option_specs(PYTEST_OPTIONS)["devices"], devices, True, None)
    except ValueError as exc:
        raise pytest.UsageError(f"pallas-check: --pallas-check-devices {devices}: {exc}"
                                ) from None
    return dataclasses.replace(options, config=dataclasses.replace(options.config,
                                                                   devices=cast(int, count)))


def _use_devices(count: int, compiling: bool) -> None:
    """`--pallas-check-devices N`: N CPU devices, as `pallas-check run --devices N` makes
    them. XLA reads the count when JAX starts its CPU backend; a test session has usually
    not started it yet here, and where it has (a conftest that ran JAX) with another
    count, that is a usage error rather than tests checked on the wrong devices."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    os.environ["XLA_FLAGS"] = " ".join(
        [*flags, f"--xla_force_host_platform_device_count={count}"])
    if "jax" not in sys.modules:
        return  # JAX starts with the flag (xdist workers inherit it too)
    import jax  # (imported already: this loads nothing)

    start_backends_quietly(compiling)
    found = len(jax.devices("cpu"))
    if found != count:
        raise pytest.UsageError(f"pallas-check: --pallas-check-devices {count}: JAX is"
                                f" already running with {found} CPU device(s) in this"
                                " process (something ran JAX before the tests started)")


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    options = config.stash.get(_OPTIONS_KEY, None)
    if options is None:
        return None
    header = [_options_line(options.config)]
    if options.config.chip_compile and libtpu_missing() is not None:
        header.append(f"pallas-check: {NOT_CHECKED}")  # once a session, not once a test
    return header


def _options_line(check: Config) -> str:
    # The plugin's other options where they are not the default (`tpu=v6e, seed=3`).
    others = "".join(f", {o.key}={getattr(value, 'value', value)}" for o in PYTEST_OPTIONS
                     if o.config_field not in (None, "dma_mode", "uninit", "races")
                     and (value := getattr(check, o.config_field)) != o.default)
    return (f"pallas-check: on (dma={check.dma_mode.value}, uninit={check.uninit.value},"
            f" races={check.races}{others})")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    options = item.config.stash.get(_OPTIONS_KEY, None)
    if options is None or item.get_closest_marker(MARKER) is not None:
        return (yield)

    failure: BaseException | None = None
    result = run = None
    try:
        with pallas_check.api.checked(options, item.nodeid, rerun=_rerun(item),
                     cwd=str(item.config.rootpath), retrace=_retrace(item, options)) as run:
            result = yield
    except BaseException as exc:  # the test's own failure; re-raised below
        failure = exc
    if run is None or run.report is None:  # the block never began
        raise failure if failure is not None else RuntimeError("pallas-check: no report")
    report = run.report
    # A call the chip refused raised in the test (intercept/chip.py); a test that passed
    # caught it -- it asserts the refusal, as it would on a TPU: no finding of this test.
    caught = [f for f in report.findings if "raised" in f.details] if failure is None else []
    if caught:
        report = dataclasses.replace(report, findings=[f for f in report.findings
                                                       if "raised" not in f.details])
    item.user_properties.append(("pallas_check_refusals_caught", len(caught)))
    item.user_properties.append(("pallas_check_calls", len(report.calls)))
    item.user_properties.append(("pallas_check_findings", len(report.findings)))
    item.user_properties.append(("pallas_check_suppressed", len(report.suppressed)))
    # The runner's verdict on what the checking found; the test's own failure is pytest's.
    verdict = pallas_check.run.runner.checks_verdict(report)
    if verdict.code not in (ExitCode.FINDINGS, ExitCode.INTERNAL):
        if failure is not None:
            raise failure
        return result
    if verdict.error is not None:
        pytest.fail(f"pallas-check error: {one_line(verdict.error)}\n{verdict.text}",
                    pytrace=False)
    if failure is not None:
        item.add_report_section("call", SECTION, verdict.text)
        raise failure
    pytest.fail(f"pallas-check: {plural(len(report.findings), 'finding')} in {item.nodeid}\n"
                f"{verdict.text}", pytrace=False)


def _retrace(item: pytest.Item, options: Options
             ) -> Callable[[TpuGeneration], GenerationRun]:
    """How the test runs again as a further generation of `tpu` (intercept/generations.py: with
    --pallas-check-compile or --pallas-check-tpu-all, when the test asked which chip it
    runs on): its body once more in this process, told that chip."""
    return lambda generation: pallas_check.commands.retrace.rerun_in_process(item.runtest,
                                                                    options.config, generation)


def _rerun(item: pytest.Item) -> str:
    """The start of the replay command of a test's findings: pytest on this one test, from
    where pytest resolves its node id (the rootdir), with the plugin on; the report adds
    the plugin's flags and the finding's seed (report/run_report.py)."""
    here = os.path.abspath(os.curdir)
    root = str(item.config.rootpath)
    cd = "" if here == root else f"cd {shlex.quote(root)} && "
    return f"{cd}pytest {shlex.quote(item.nodeid)} --pallas-check"


class _CallCounter:
    """`pytest --pallas-check` that checked no pallas_call at all exits 5, pytest's "no
    tests collected", as `pallas-check run` does: a CI job pointed at tests that make no
    kernel call is not green. Counted where every test's report arrives (on the xdist
    controller too: a test's user_properties travel with its report); an xdist worker,
    which sees only its own tests, decides nothing. The line saying so is written with
    the terminal summary, after pytest ended the progress line (`[100%]`)."""

    def __init__(self) -> None:
        self.calls = 0
        self.none_checked = False

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call":
            # (the plugin records the count as an int; pytest types a property `object`)
            self.calls += sum(int(cast(int, value)) for name, value in report.user_properties
                              if name == "pallas_check_calls")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if (hasattr(session.config, "workerinput") or exitstatus != pytest.ExitCode.OK
                or session.testscollected == 0 or self.calls):
            return
        session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED
        self.none_checked = True

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.none_checked:
            terminalreporter.write_line("pallas-check: no pallas_call was checked: the tests"
                                        f" made none (exit {int(ExitCode.NO_CALLS)})")


# -- hardware recordings as tests (`pytest --pallas-check-replay DIR`) ---------------------

def pytest_collect_file(file_path: pathlib.Path, parent: pytest.Collector
                        ) -> pytest.Collector | None:
    """A recording under a collected folder, with --pallas-check-replay: one test."""
    if file_path.suffix != ".npz" or not parent.config.getoption("pallas_check_replay"):
        return None
    return _RecordingFile.from_parent(parent, path=file_path)


class _RecordingFile(pytest.File):
    def collect(self) -> list[pytest.Item]:
        return [_ReplayItem.from_parent(self, name=f"replay[{self.path.name}]")]


class ReplayDisagrees(AssertionError):
    """`pallas-check replay` found ours and the chip apart (or could not replay)."""


class _ReplayItem(pytest.Item):
    """`pallas-check replay FILE` in a process of its own (a replay runs the recorded script
    as `__main__`, with its own interception: never inside this pytest process), from the
    rootdir, where a recording's script path is relative to; its report is the failure."""

    def runtest(self) -> None:

        proc = subprocess.run([sys.executable, "-m", "pallas_check", "replay", str(self.path),
                               "--format", "table"], cwd=self.config.rootpath,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise ReplayDisagrees(f"pallas-check replay {self.path.name} exited"
                                  f" {proc.returncode}:\n{proc.stdout}{proc.stderr}")

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException],
                     style: object = None) -> str:
        if isinstance(excinfo.value, ReplayDisagrees):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[pathlib.Path, int, str]:
        return self.path, 0, f"replay of {self.path.name}"
