"""pytest plugin: `pytest --pallas-check` checks every pallas_call a test makes.

Registered as the `pallas_check` entry point of `pytest11`, so it is loaded wherever
pallas-check is installed, and does nothing unless `--pallas-check` is given (it imports
neither JAX nor the engine before that). With it, each test's call phase runs inside a
`Session(config).install()`: findings fail the test, with the table report as the failure
text; a test that failed on its own keeps its failure and gets the table as an extra report
section. `@pytest.mark.pallas_check_skip` runs a test without interception.

Options: `--pallas-check-races`, `--pallas-check-dma eager|on_wait|random`,
`--pallas-check-uninit nan|zero`, `--pallas-check-compile` (each call also compiled for the
TPU generations of `tpu`, after the test); the other settings of `[tool.pallas-check]` in the
pyproject.toml found from pytest's rootdir (and `PALLAS_CHECK_*` variables) apply too, with
these flags over them. One session per test and per process, so pytest-xdist (`-n N`) needs
nothing more.
"""

from __future__ import annotations

import io
from typing import Any, Generator

import pytest

from pallas_check.options import RUN_OPTIONS  # plain data: no JAX imported

PYTEST_OPTIONS = tuple(option for option in RUN_OPTIONS if option.pytest)

MARKER = "pallas_check_skip"
SECTION = "pallas-check"

_CONFIG_KEY: "pytest.StashKey[Any]" = pytest.StashKey()
_POLICY_KEY: "pytest.StashKey[Any]" = pytest.StashKey()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pallas-check", "pallas-check: check Pallas kernels on CPU")
    group.addoption("--pallas-check", action="store_true", default=False,
                    help="Run each test with every pallas_call simulated and checked by"
                         " pallas-check; findings fail the test.")
    for option in PYTEST_OPTIONS:  # declared in options.py
        if option.kind is bool:
            group.addoption(f"--pallas-check-{option.key}", action="store_true", default=None,
                            help=option.help)
        else:
            group.addoption(f"--pallas-check-{option.key}", choices=option.choices or None,
                            default=None, help=option.help)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}: run this test without pallas-check's interception.")
    if config.getoption("pallas_check"):
        config.stash[_CONFIG_KEY] = check = _check_config(config)
        config.stash[_POLICY_KEY] = _policy(config, check)
        if check.compile:
            from pallas_check.tpu_compile.toolchain import quiet_environment

            quiet_environment(compiling=True)  # before libtpu loads


def _policy(config: pytest.Config, check: Any) -> Any:
    """`ignore` and `baseline` of [tool.pallas-check] (inline comments always apply). One
    test rarely runs every path of a kernel, so unused comments are not reported here."""
    from pallas_check.settings import SettingsError, load_settings
    from pallas_check.suppress import SuppressionError, make_policy

    try:
        values = load_settings(RUN_OPTIONS, cwd=config.rootpath).values
        return make_policy(values.get("ignore"), values.get("baseline"), False,
                           check.races, report_unused=False)
    except (SettingsError, SuppressionError) as exc:
        raise pytest.UsageError(f"pallas-check: {exc}") from None


def _check_config(config: pytest.Config) -> Any:
    """The run Config: defaults < [tool.pallas-check] < PALLAS_CHECK_* < these flags."""
    from pallas_check.config import Config
    from pallas_check.settings import SettingsError, load_settings

    try:
        values = load_settings(RUN_OPTIONS, cwd=config.rootpath).values
    except SettingsError as exc:
        raise pytest.UsageError(f"pallas-check: {exc}") from None
    fields: dict[str, Any] = {}
    for option in RUN_OPTIONS:
        # --devices cannot apply: the test process started JAX with its own device count.
        if option.config_field is None or option.param == "devices":
            continue
        value = config.getoption(f"pallas_check_{option.param}") if option.pytest else None
        if value is None and option.param in values:
            value = values[option.param]
        if value is not None:
            fields[option.config_field] = option.kind(value)
    return Config(**fields)


def pytest_report_header(config: pytest.Config) -> str | None:
    check = config.stash.get(_CONFIG_KEY, None)
    if check is None:
        return None
    return (f"pallas-check: on (dma={check.dma_mode.value}, uninit={check.uninit.value},"
            f" races={check.races})")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    check = item.config.stash.get(_CONFIG_KEY, None)
    if check is None or item.get_closest_marker(MARKER) is not None:
        return (yield)

    from pallas_check.runner import callback_failures, one_line
    from pallas_check.session import Session
    from pallas_check.suppress import apply

    session = Session(check)
    failure: BaseException | None = None
    result = None
    with callback_failures() as ours, session.install():
        try:
            result = yield
        except BaseException as exc:  # the test's own failure; re-raised below
            failure = exc
    session.finish()
    compile_error = _compile(session)
    kept = apply(session.findings, session.calls, item.config.stash[_POLICY_KEY],
                 cwd=str(item.config.rootpath))
    findings = kept.active
    engine_error = session.engine_error or (ours[0] if ours else None) or compile_error
    item.user_properties.append(("pallas_check_findings", len(findings)))
    item.user_properties.append(("pallas_check_suppressed", len(kept.suppressed)))
    if not findings and engine_error is None:
        if failure is not None:
            raise failure
        return result
    text = _render(item, session, findings, engine_error, kept.suppressed)
    if engine_error is not None:
        pytest.fail(f"pallas-check error: {one_line(engine_error)}\n{text}", pytrace=False)
    if failure is not None:
        item.add_report_section("call", SECTION, text)
        raise failure
    pytest.fail(f"pallas-check: {len(findings)} finding(s) in {item.nodeid}\n{text}",
                pytrace=False)


def _compile(session: Any) -> str | None:
    """`--pallas-check-compile` (or `compile = true`): the test's calls compiled for the TPU
    generations of `tpu`, after the test, with no interception installed."""
    if session.compile_recorder is None or session.engine_error:
        return None
    from pallas_check.tpu_compile.stage import compile_session
    from pallas_check.tpu_compile.toolchain import libtpu_missing

    missing = libtpu_missing()
    if missing:
        raise pytest.UsageError(f"pallas-check: {missing}")
    try:
        compile_session(session)
    except Exception as exc:  # noqa: BLE001 - ours: the test fails with it
        return f"internal error while compiling for TPU: {type(exc).__name__}: {exc}"
    return None


def _render(item: pytest.Item, session: Any, findings: list, engine_error: str | None,
            suppressed: list) -> str:
    from pallas_check.report.model import RunReport
    from pallas_check.report.table import TableReporter
    from pallas_check.runner import config_dict

    report = RunReport(script=item.nodeid, rerun=f"pytest {item.nodeid} --pallas-check",
                       config=config_dict(session.config),
                       findings=findings, calls=sorted(session.calls, key=lambda c: c.index),
                       exit_code=4 if engine_error else 1, internal_error=engine_error,
                       suppressed=suppressed)
    buffer = io.StringIO()
    TableReporter().render(report, buffer)
    return buffer.getvalue()
