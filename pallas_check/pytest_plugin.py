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
fixtures and its wrappers all see that chip (tpu_info.py), while XLA runs on the CPU.

Options: `--pallas-check-races`, `--pallas-check-dma eager|on_wait|random`,
`--pallas-check-uninit nan|zero`, `--pallas-check-tpu v5e|v5p|v6e|v7x[,...]`,
`--pallas-check-compile` (each call also compiled for the TPU generations of `tpu`, after
the test; with several, a test that asked which chip it runs on is run again in-process as
each further one and that run compiled: generations.py), `--pallas-check-tpu-all` (those
runs checked too), `--pallas-check-kernel GLOB` (repeatable) and
`--pallas-check-calls N` (check only those kernels, and the first N calls of each call
structure; the rest pass through unchecked); the other settings of `[tool.pallas-check]` in the
pyproject.toml found from pytest's rootdir (and `PALLAS_CHECK_*` variables) apply too, with
these flags over them. One session per test and per process, so pytest-xdist (`-n N`) needs
nothing more.
"""

from __future__ import annotations

from typing import Any, Generator

import pytest

from pallas_check.config.options import RUN_OPTIONS  # plain data: no JAX imported
from pallas_check.exitcodes import ExitCode
from pallas_check.units import plural

PYTEST_OPTIONS = tuple(option for option in RUN_OPTIONS if option.pytest)

MARKER = "pallas_check_skip"
SECTION = "pallas-check"

_OPTIONS_KEY: "pytest.StashKey[Any]" = pytest.StashKey()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pallas-check", "pallas-check: check Pallas kernels on CPU")
    group.addoption("--pallas-check", action="store_true", default=False,
                    help="Run each test with every pallas_call simulated and checked by"
                         " pallas-check; findings fail the test.")
    for option in PYTEST_OPTIONS:  # declared in options.py
        if option.kind is bool:
            group.addoption(f"--pallas-check-{option.key}", action="store_true", default=None,
                            help=option.help)
        elif "List" in str(option.kind):  # repeatable, e.g. --pallas-check-kernel
            group.addoption(f"--pallas-check-{option.key}", action="append", default=None,
                            help=option.help)
        else:
            group.addoption(f"--pallas-check-{option.key}", choices=option.choices or None,
                            default=None, help=option.help)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}: run this test without pallas-check's interception.")
    if config.getoption("pallas_check"):
        config.pluginmanager.register(_CallCounter(), "pallas-check-call-counter")
        config.stash[_OPTIONS_KEY] = options = _options(config)
        if options.config.compile:
            from pallas_check.tpu_compile.toolchain import libtpu_missing, quiet_environment

            missing = libtpu_missing()
            if missing:
                raise pytest.UsageError(f"pallas-check: {missing}")
            quiet_environment(compiling=True)  # before libtpu loads
        _simulate_the_tpu(config, options.config)


def _simulate_the_tpu(config: pytest.Config, check: Any) -> None:
    """The simulated TPU (tpu_info.py) for the whole session, from before collection to
    the end: a TPU-only suite's module-level `skipif(no TPU device)`, its fixtures and
    its wrappers ask which chip they run on before any test's pallas_call, and are told
    `tpu` (the first generation) as each test's own checking is."""
    import contextlib

    from pallas_check.tpu_info import simulated_tpu

    stack = contextlib.ExitStack()
    stack.enter_context(simulated_tpu(check.tpu, check.cores))
    config.add_cleanup(stack.close)


def _options(config: pytest.Config) -> Any:
    """The Python API's options (api.py): defaults < [tool.pallas-check] of the rootdir's
    pyproject < PALLAS_CHECK_* < these flags. `ignore` and `baseline` apply (inline
    comments always do); one test rarely runs every path of a kernel, so unused comments
    are not reported here. --devices cannot apply: the test process started JAX with its
    own device count."""
    from pallas_check.api import resolve

    flags = {option.key.replace("-", "_"): config.getoption(f"pallas_check_{option.param}")
             for option in PYTEST_OPTIONS}
    try:
        return resolve({k: v for k, v in flags.items() if v is not None},
                       project=config.rootpath, report_unused=False)
    except ValueError as exc:
        raise pytest.UsageError(f"pallas-check: {exc}") from None


def pytest_report_header(config: pytest.Config) -> str | None:
    options = config.stash.get(_OPTIONS_KEY, None)
    if options is None:
        return None
    check = options.config
    return (f"pallas-check: on (dma={check.dma_mode.value}, uninit={check.uninit.value},"
            f" races={check.races})")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    options = item.config.stash.get(_OPTIONS_KEY, None)
    if options is None or item.get_closest_marker(MARKER) is not None:
        return (yield)

    from pallas_check.api import checked
    from pallas_check.runner import checks_verdict, one_line

    failure: BaseException | None = None
    result = run = None
    try:
        with checked(options, item.nodeid, rerun=f"pytest {item.nodeid} --pallas-check",
                     cwd=str(item.config.rootpath), retrace=_retrace(item, options)) as run:
            result = yield
    except BaseException as exc:  # the test's own failure; re-raised below
        failure = exc
    if run is None or run.report is None:  # the block never began
        raise failure if failure is not None else RuntimeError("pallas-check: no report")
    report = run.report
    item.user_properties.append(("pallas_check_calls", len(report.calls)))
    item.user_properties.append(("pallas_check_findings", len(report.findings)))
    item.user_properties.append(("pallas_check_suppressed", len(report.suppressed)))
    # The runner's verdict on what the checking found; the test's own failure is pytest's.
    verdict = checks_verdict(report)
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


def _retrace(item: pytest.Item, options: Any) -> Any:
    """How the test runs again as a further generation of `tpu` (generations.py: with
    --pallas-check-compile or --pallas-check-tpu-all, when the test asked which chip it
    runs on): its body once more in this process, told that chip."""
    from pallas_check.retrace import rerun_in_process

    return lambda generation: rerun_in_process(item.runtest, options.config, generation)


class _CallCounter:
    """`pytest --pallas-check` that checked no pallas_call at all exits 5, pytest's "no
    tests collected", as `pallas-check run` does: a CI job pointed at tests that make no
    kernel call is not green. Counted where every test's report arrives (on the xdist
    controller too: a test's user_properties travel with its report); an xdist worker,
    which sees only its own tests, decides nothing."""

    def __init__(self) -> None:
        self.calls = 0

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call":
            self.calls += sum(int(value) for name, value in report.user_properties
                              if name == "pallas_check_calls")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if (hasattr(session.config, "workerinput") or exitstatus != pytest.ExitCode.OK
                or session.testscollected == 0 or self.calls):
            return
        session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line("pallas-check: no pallas_call was checked: the tests made"
                                f" none (exit {int(ExitCode.NO_CALLS)})")

