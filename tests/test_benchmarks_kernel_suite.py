"""The suite benchmark (benchmarks/kernel_suite_bench.py): its JUnit parsing and its sums
per family on a fixture (no timing asserted), and its kernel repository green under
`pytest --pallas-check` as the benchmark runs it (one cheap test)."""

from __future__ import annotations

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import kernel_suite_bench as bench  # noqa: E402


def _junit(cases: list[tuple[str, str, float, str]]) -> str:
    """A pytest JUnit report of (module, test, seconds, outcome) cases."""
    body = []
    for module, name, seconds, outcome in cases:
        inner = {"passed": "", "failed": '<failure message="AssertionError: off by 1">x</failure>',
                 "skipped": '<skipped message="needs a TPU" />',
                 "error": '<error message="ValueError: bad block">y</error>'}[outcome]
        body.append(f'<testcase classname="tests.{module}" name="{name}" time="{seconds}">'
                    f"{inner}</testcase>")
    return ('<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">'
            + "".join(body) + "</testsuite></testsuites>")


def _run(mode: str, cases: list[tuple[str, str, float, str]]) -> bench.Run:
    return bench.Run(mode, sum(c[2] for c in cases) + 5.0, 0, bench.parse_junit(_junit(cases)))


def test_junit_cases_become_tests_of_their_family():
    tests = bench.parse_junit(_junit([("test_flash", "test_fwd[True]", 2.5, "passed"),
                                      ("test_gmm", "test_tgmm", 1.0, "failed"),
                                      ("test_rope", "test_rope", 0.0, "skipped")]))
    assert tests == {
        "tests.test_flash::test_fwd[True]": {"family": "flash", "name": "test_fwd[True]",
                                             "seconds": 2.5, "status": "passed", "message": ""},
        "tests.test_gmm::test_tgmm": {"family": "gmm", "name": "test_tgmm", "seconds": 1.0,
                                      "status": "failed",
                                      "message": "AssertionError: off by 1"},
        "tests.test_rope::test_rope": {"family": "rope", "name": "test_rope", "seconds": 0.0,
                                       "status": "skipped", "message": "needs a TPU"}}


def test_sums_per_family_over_the_tests_every_mode_passed():
    cold = _run("cold", [("test_flash", "a", 2.0, "passed"), ("test_flash", "b", 1.0, "passed"),
                         ("test_gmm", "c", 4.0, "passed"), ("test_gmm", "d", 9.0, "error")])
    warm = _run("warm", [("test_flash", "a", 0.5, "passed"), ("test_flash", "b", 0.5, "passed"),
                         ("test_gmm", "c", 1.0, "passed"), ("test_gmm", "d", 1.0, "passed")])
    tpu = _run("tpu-races", [("test_flash", "a", 9.0, "passed"),
                             ("test_flash", "b", 3.0, "passed"),
                             ("test_gmm", "c", 4.0, "passed"), ("test_gmm", "d", 1.0, "passed")])
    runs = {"cold": cold, "warm": warm, "tpu-races": tpu}
    summary = bench.summarize(runs)
    flash, gmm = summary["families"]["flash"], summary["families"]["gmm"]
    assert flash["tests"] == 2 and flash["seconds"] == {"cold": 3.0, "warm": 1.0,
                                                        "tpu-races": 12.0}
    assert flash["tpu_over_cold"] == 4.0 and flash["tpu_over_warm"] == 12.0
    # d errored under cold: left out of every mode's sum.
    assert gmm["tests"] == 1 and gmm["seconds"] == {"cold": 4.0, "warm": 1.0, "tpu-races": 4.0}
    total = summary["total"]
    assert (summary["comparable_tests"], summary["all_tests"]) == (3, 4)
    assert total["seconds"] == {"cold": 7.0, "warm": 2.0, "tpu-races": 16.0}
    assert total["hlo_over_cold"] is None  # not run
    assert summary["targets"] == {"cold_total": False, "cold_every_family": False,
                                  "families_below": ["gmm"], "warm_total": True}
    text = "\n".join(bench.report(runs, summary))
    assert "| flash | 2 | 3.0 | 1.0 | 12.0 | 4.00x | 12.00x | - |" in text
    assert "| gmm | d | error | 1.00 | 1.00 | - | 1.00x |" in text
    assert "- tests.test_gmm::d [cold] error: ValueError: bad block" in text
    assert "(target >= 3x: NOT met); every family >= 1.5x: NOT met (below: gmm)" in text


def test_auto_against_the_engine_lists_the_tests_over_1_2x_and_the_memory():
    cold = _run("cold", [("test_flash", "a", 2.5, "passed"), ("test_flash", "b", 1.0, "passed"),
                         ("test_gmm", "c", 1.3, "passed")])
    engine = _run("engine", [("test_flash", "a", 2.0, "passed"),
                             ("test_flash", "b", 1.0, "passed"),
                             ("test_gmm", "c", 1.0, "failed")])
    cold.peak_rss_mib, engine.peak_rss_mib = 600.0, 400.0
    lines = bench.engine_comparison({"cold": cold, "engine": engine})
    assert lines == [
        "- auto (cold) against the engine alone (cold): 1 of 2 tests over 1.2x:",
        "  - tests.test_flash::a: 2.50 s against 2.00 s (1.25x)",
        "- peak memory, auto over engine (whole processes): 1.50x", ""]
    assert bench.engine_comparison({"cold": cold}) == []


def test_the_suite_passes_under_pallas_check_as_the_benchmark_runs_it(tmp_path):
    """One cheap test of the repository through the benchmark's own command: the plugin
    makes the TPU gate pass, the kernel is checked and matches its reference."""
    [module] = bench.families(["reduce"])
    run = bench.run_mode("cold", [module], tmp_path / "cache", timeout=300,
                         keyword="test_row_max")
    assert run.returncode == 0, run.tail
    assert [(t["name"], t["status"]) for t in run.tests.values()] == [("test_row_max", "passed")]
