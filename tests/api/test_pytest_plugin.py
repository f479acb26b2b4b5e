"""The pytest plugin (`pytest --pallas-check`), run on small test suites with `pytester`.

The suite under test imports two samples as modules: `bug` (a DMA never waited) and `ok`
(the fixed kernel), and `rbw` (a read before a DMA's wait: a finding under
`--dma on_wait`, none under `--dma eager`).
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

# pytester's in-process runs drop the modules a run imported; imported here first, JAX's
# Pallas TPU module (which registers a PRNG once per process) and ours are kept.
import jax.experimental.pallas.tpu  # noqa: F401
import pallas_check.intercept  # noqa: F401
import pallas_check.runner  # noqa: F401
import pallas_check.session  # noqa: F401

pytest_plugins = ["pytester"]

SAMPLES = Path(__file__).resolve().parents[2] / "samples"

SUITE = """\
import jax
import jax.numpy as jnp
import pytest

import bug
import ok
from pallas_check import intercept

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
from pallas_check import intercept


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


def test_tests_that_check_no_pallas_call_exit_5(pytester):
    """As `pallas-check run` on a script without a kernel call: nothing checked is not
    green (pytest's "no tests collected"); one test with a call makes it 0 again."""
    pytester.makepyfile(test_no_kernel="def test_arithmetic():\n    assert 1 + 1 == 2\n")
    result = pytester.runpytest("--pallas-check", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED == 5
    result.stdout.fnmatch_lines(["pallas-check: no pallas_call was checked*"])


def test_options_reach_the_engine(suite):
    suite.makepyfile(test_rbw=RBW)
    on_wait = suite.runpytest("--pallas-check", "-p", "no:cacheprovider", "test_rbw.py")
    on_wait.assert_outcomes(failed=1)
    on_wait.stdout.fnmatch_lines(["*Uninitialized memory reaching outputs (1)*"])
    eager = suite.runpytest("--pallas-check", "--pallas-check-dma", "eager",
                            "--pallas-check-uninit", "zero", "-p", "no:cacheprovider",
                            "test_rbw.py")
    eager.assert_outcomes(passed=1)
    assert eager.ret == pytest.ExitCode.OK  # a test that checked a call: not exit 5
    assert "pallas-check: on (dma=eager, uninit=zero, races=False)" in eager.stdout.str()
    # Under eager DMAs the read still races with the DMA's write: --pallas-check-races.
    races = suite.runpytest("--pallas-check", "--pallas-check-dma", "eager",
                            "--pallas-check-races", "-p", "no:cacheprovider", "test_rbw.py")
    races.assert_outcomes(failed=1)
    races.stdout.fnmatch_lines(["*Data races (1)*"])


def test_pyproject_settings_apply(suite):
    suite.makepyfile(test_rbw=RBW)
    (suite.path / "pyproject.toml").write_text('[tool.pallas-check]\ndma = "eager"\n')
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
