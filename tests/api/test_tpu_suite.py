"""A kernel repository's TPU-only test suite, green on a CPU: tests/kernel_repo (its wrappers
ask the chip before any kernel runs: the device kind, a TensorCore mesh without num_cores,
get_tpu_info; the module skips itself without a TPU device) run by `pytest --pallas-check
--pallas-check-tpu v6e` in a process of its own, as a user runs it. Every test runs (none
skipped), passes its numpy checks, and has its calls checked."""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[1] / "kernel_repo"
TESTS = ["test_scale_rows", "test_scale_rows_jitted", "test_double_per_core",
         "test_add_tiled"]


@pytest.fixture
def repo(pytester: pytest.Pytester) -> pytest.Pytester:
    for name in ("kernels.py", "tpu_suite.py"):
        shutil.copy(REPO / name, pytester.path / name)
    return pytester


def test_the_suite_skips_itself_without_a_tpu(repo):
    """The suite is a TPU-only one: without pallas-check every test is skipped."""
    result = repo.runpytest("-p", "no:cacheprovider", "tpu_suite.py")
    result.assert_outcomes(skipped=len(TESTS))


def test_the_suite_runs_green_as_a_v6e(repo):
    junit = repo.path / "junit.xml"
    result = repo.runpytest_subprocess(
        "--pallas-check", "--pallas-check-tpu", "v6e", "-p", "no:cacheprovider",
        f"--junitxml={junit}", "tpu_suite.py")
    result.assert_outcomes(passed=len(TESTS))
    assert result.ret == pytest.ExitCode.OK
    calls = {case.get("name"): {p.get("name"): int(p.get("value"))
                                for p in case.iter("property")}
             for case in ElementTree.parse(junit).getroot().iter("testcase")}
    assert sorted(calls) == sorted(TESTS)
    for name, properties in calls.items():
        assert properties["pallas_check_calls"] == 1, name
        assert properties["pallas_check_findings"] == 0, name
