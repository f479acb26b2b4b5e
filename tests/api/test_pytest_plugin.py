"""The pytest plugin (`pytest --pallas-check`), run on small test suites with `pytester`.

The suite under test imports two samples as modules: `bug` (a DMA never waited) and `ok`
(the fixed kernel), and `rbw` (a read before a DMA's wait: a finding under
`--dma on_wait`, none under `--dma eager`).
"""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

import pytest

# pytester's in-process runs drop the modules a run imported; imported here first, JAX's
# Pallas TPU module (which registers a PRNG once per process) and ours are kept.
import jax.experimental.pallas.tpu  # noqa: F401
import pallas_check.intercept.patched_lowering  # noqa: F401
import pallas_check.run.runner  # noqa: F401
import pallas_check.intercept.session  # noqa: F401

pytest_plugins = ["pytester"]

SAMPLES = Path(__file__).resolve().parents[2] / "samples"

SUITE = """\
import jax
import jax.numpy as jnp
import pytest

import bug
import ok
from pallas_check.intercept import patched_lowering as intercept

X = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)


def test_ok_kernel():
    assert intercept._saved is not None  # the call phase runs with interception
    jax.block_until_ready(ok.hbm_copy(X))


def test_buggy_kernel():
    jax.block_until_ready(bug.hbm_copy(X))


def test_buggy_kernel_and_own_failure():
    jax.block_until_ready(jax.jit(bug.hbm_copy)(X))
    assert False, "the test's own failure"


@pytest.mark.pallas_check_skip
def test_opted_out():
    assert intercept._saved is None
"""

PLAIN = """\
from pallas_check.intercept import patched_lowering as intercept


def test_plugin_is_idle():
    assert intercept._saved is None
"""

RBW = """\
import jax
import jax.numpy as jnp

import rbw


def test_read_before_wait():
    x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
    jax.block_until_ready(rbw.load_double(x))
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    shutil.copy(SAMPLES / "dma_not_waited_bug.py", pytester.path / "bug.py")
    shutil.copy(SAMPLES / "dma_not_waited_ok.py", pytester.path / "ok.py")
    shutil.copy(SAMPLES / "dma_read_before_wait_bug.py", pytester.path / "rbw.py")
    pytester.makepyfile(test_kernels=SUITE)
    return pytester


def test_findings_fail_tests_with_the_table(suite):
    result = suite.runpytest("--pallas-check", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=2)
    out = result.stdout.str()
    assert "pallas-check: on (dma=on_wait" in out
    # The finding alone fails the test; the report is the table, not a traceback.
    result.stdout.fnmatch_lines([
        "*_ test_buggy_kernel _*",
        "pallas-check: 1 finding in test_kernels.py::test_buggy_kernel",
        "DMAs never waited (1)*",
    ])
    assert "bug.py:21" in out and "copy.start()" in out
    # A test that failed on its own keeps its failure and gets the table as a section.
    result.stdout.fnmatch_lines([
        "*_ test_buggy_kernel_and_own_failure _*",
        "*AssertionError: the test's own failure*",
        "*Captured pallas-check call*",
        "DMAs never waited (1)*",
    ])
    result.stdout.fnmatch_lines(["FAILED test_kernels.py::test_buggy_kernel - *pallas-check*"])


def test_without_the_flag_the_plugin_does_nothing(pytester):
    pytester.makepyfile(test_plain=PLAIN)
    result = pytester.runpytest("-p", "no:cacheprovider", "--strict-markers")
    result.assert_outcomes(passed=1)
    assert "pallas-check: on" not in result.stdout.str()


NO_CALL_LINE = "pallas-check: no pallas_call was checked: the tests made none (exit 5)"


def test_tests_that_check_no_pallas_call_exit_5(pytester):
    """As `pallas-check run` on a script without a kernel call: nothing checked is not
    green (pytest's "no tests collected"); the line saying so is a line of its own, also
    after `-q`'s progress (`..  [100%]`), not glued to it."""
    pytester.makepyfile(test_no_kernel="def test_arithmetic():\n    assert 1 + 1 == 2\n")
    for quiet in ((), ("-q",)):
        result = pytester.runpytest("--pallas-check", "-p", "no:cacheprovider", *quiet)
        result.assert_outcomes(passed=1)
        assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED == 5
        assert NO_CALL_LINE in result.stdout.lines, result.stdout.str()


def _header(result) -> str:
    """The run's output, the header's `chip-compile=False` left out: tests/conftest.py turns
    the chip's compile off for every test that is not about it (the header names an option
    that is not its default)."""
    return result.stdout.str().replace(", chip-compile=False", "")


def test_options_reach_the_engine(suite):
    suite.makepyfile(test_rbw=RBW)
    on_wait = suite.runpytest("--pallas-check", "-p", "no:cacheprovider", "test_rbw.py")
    on_wait.assert_outcomes(failed=1)
    on_wait.stdout.fnmatch_lines(["*Uninitialized memory reaching outputs (1)*"])
    eager = suite.runpytest("--pallas-check", "--pallas-check-dma", "eager",
                            "--pallas-check-uninit", "zero", "--pallas-check-no-races",
                            "-p", "no:cacheprovider", "test_rbw.py")
    eager.assert_outcomes(passed=1)
    assert eager.ret == pytest.ExitCode.OK  # a test that checked a call: not exit 5
    assert "pallas-check: on (dma=eager, uninit=zero, races=False)" in _header(eager)
    # Under eager DMAs the read still races with the DMA's write: races are on by default.
    races = suite.runpytest("--pallas-check", "--pallas-check-dma", "eager",
                            "-p", "no:cacheprovider", "test_rbw.py")
    races.assert_outcomes(failed=1)
    races.stdout.fnmatch_lines(["*Data races (1)*"])


def test_pyproject_settings_apply(suite):
    suite.makepyfile(test_rbw=RBW)
    (suite.path / "pyproject.toml").write_text(
        '[tool.pallas-check]\ndma = "eager"\nraces = false\n')
    result = suite.runpytest("--pallas-check", "-p", "no:cacheprovider", "test_rbw.py")
    result.assert_outcomes(passed=1)
    (suite.path / "pyproject.toml").write_text('[tool.pallas-check]\nwhatever = 1\n')
    result = suite.runpytest("--pallas-check", "-p", "no:cacheprovider", "test_rbw.py")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "whatever" in result.stderr.str()


def test_with_xdist(suite):
    if importlib.util.find_spec("xdist") is None:
        pytest.skip("pytest-xdist is not installed (it is in the test extra)")
    result = suite.runpytest_subprocess("--pallas-check", "-n", "2", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=2)
    out = result.stdout.str()
    assert "DMAs never waited (1)" in out and "bug.py:21" in out
    result.stdout.fnmatch_lines(["*2 workers*"])


DEVICES = """\
import jax


def test_devices():
    assert jax.device_count() == 2  # --pallas-check-devices reached the worker's JAX
"""


def test_under_xdist_no_call_is_exit_5_and_devices_reach_the_workers(pytester):
    """`-n 2`: the controller, which runs no test, still says that none checked a call
    (exit 5, a line of its own); `--pallas-check-devices 2` is each worker's device
    count, as `run --devices 2` is a script's."""
    if importlib.util.find_spec("xdist") is None:
        pytest.skip("pytest-xdist is not installed (it is in the test extra)")
    pytester.makepyfile(test_devices=DEVICES)
    result = pytester.runpytest_subprocess("--pallas-check", "--pallas-check-devices", "2",
                                           "-n", "2", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    assert NO_CALL_LINE in result.stdout.lines, result.stdout.str()


def test_devices_once_jax_runs_is_a_usage_error(pytester):
    """In this process JAX already runs with one CPU device: --pallas-check-devices 2
    cannot apply, and says so instead of checking on one device."""
    pytester.makepyfile(test_plain="def test_a():\n    pass\n")
    result = pytester.runpytest("--pallas-check", "--pallas-check-devices", "2",
                                "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert ("--pallas-check-devices 2: JAX is already running with 1 CPU device(s)"
            in result.stderr.str())


def test_the_replay_line_reproduces_the_finding(suite):
    """A finding's replay line is a pytest command: the test, the plugin's flags that
    differ from the defaults, the finding's seed (`--pallas-check-seed`); run as printed,
    it finds the same finding with that seed."""
    import shlex

    first = suite.runpytest("--pallas-check", "--pallas-check-dma", "random",
                            "--pallas-check-seed", "3", "--pallas-check-tpu", "v6e",
                            "-p", "no:cacheprovider", "test_kernels.py::test_buggy_kernel")
    first.assert_outcomes(failed=1)
    assert "pallas-check: on (dma=random, uninit=nan, races=True, tpu=v6e, seed=3)" \
        in _header(first).splitlines()
    replay = ("pytest test_kernels.py::test_buggy_kernel --pallas-check"
              " --pallas-check-dma random --pallas-check-tpu v6e --pallas-check-seed 3")
    # (The table wraps the line at its width.)
    assert f"note: replay: {replay} " in " ".join(first.stdout.str().split())
    argv = shlex.split(replay)
    again = suite.runpytest(*argv[1:], "-p", "no:cacheprovider")
    again.assert_outcomes(failed=1)
    again.stdout.fnmatch_lines(["DMAs never waited (1)*"])
    assert "--pallas-check-seed 3" in again.stdout.str()


def test_the_help_names_only_the_plugins_flags():
    """Each option's help is `run`'s, with the flags the plugin has named as the
    plugin's (`--compile`'s "of --tpu": `--pallas-check-tpu`); none it lacks."""
    from pallas_check import pytest_plugin

    registered: dict[str, str] = {}

    class Group:
        def addoption(self, name, **kwargs):
            registered[name] = kwargs.get("help", "")

    class Parser:
        def getgroup(self, *args):
            return Group()

    pytest_plugin.pytest_addoption(Parser())
    for name, text in registered.items():
        for flag in re.findall(r"(?<![\w-])--[a-z][a-z-]*[a-z]", text):
            assert flag in registered, (name, flag, text)
    assert "--pallas-check-tpu" in registered["--pallas-check-compile"]
    assert {"--pallas-check-tpu", "--pallas-check-cores", "--pallas-check-devices",
            "--pallas-check-dma", "--pallas-check-races", "--pallas-check-no-races",
            "--pallas-check-schedules", "--pallas-check-seed"} <= set(registered)


def test_without_libtpu_the_header_says_once_that_the_compile_is_not_checked(suite,
                                                                             monkeypatch):
    import pallas_check.pytest_plugin as plugin
    from pallas_check.tpu_compile.toolchain import NOT_CHECKED

    monkeypatch.setattr(plugin, "libtpu_missing", lambda: "no libtpu")
    suite.makepyfile(test_plain=PLAIN)
    on = suite.runpytest("--pallas-check", "--pallas-check-chip-compile", "-p",
                         "no:cacheprovider", "test_plain.py")
    assert on.stdout.lines.count(f"pallas-check: {NOT_CHECKED}") == 1
    off = suite.runpytest("--pallas-check", "--pallas-check-no-compile", "-p",
                          "no:cacheprovider", "test_plain.py")
    assert f"pallas-check: {NOT_CHECKED}" not in off.stdout.lines
