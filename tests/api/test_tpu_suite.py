"""A kernel repository's TPU-only test suite, green on a CPU: tests/kernel_repo (its wrappers
ask the chip before any kernel runs: the device kind, a TensorCore mesh without num_cores,
get_tpu_info; one slices off the padding rows its kernel never wrote; one, jitted with its
cache donated, writes only the live prefix of a schedule its consumer reads; the module
skips itself without a TPU device) run by `pytest --pallas-check
--pallas-check-tpu v6e` in a process of its own, as a user runs it. Every test runs (none
skipped), passes its numpy checks, and has its calls checked."""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from pallas_check.tpu_compile.toolchain import libtpu_missing

# pytester's in-process runs drop the modules a run imported; imported here first, JAX's
# Pallas TPU modules (which register primitives once per process) and ours are kept.
import jax.experimental.pallas.tpu  # noqa: F401
import jax.experimental.pallas.tpu_sc  # noqa: F401
import pallas_check.intercept.generations  # noqa: F401
import pallas_check.run.runner  # noqa: F401

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[1] / "kernel_repo"
PER_CHIP = Path(__file__).resolve().parents[1] / "scripts" / "per_chip.py"
TESTS = ["test_scale_rows", "test_scale_rows_jitted", "test_gpu_params_are_refused",
         "test_double_per_core", "test_add_tiled", "test_scale_tokens_drops_the_padding",
         "test_matmul_matches_the_programs_own_product", "test_matmul_at_highest_matches_float64",
         "test_matmul_at_default_precision_is_not_float32",
         "test_append_tokens_updates_the_donated_cache"]
CALLS = {"test_append_tokens_updates_the_donated_cache": 2}  # else one call a test


@pytest.fixture
def repo(pytester: pytest.Pytester) -> pytest.Pytester:
    for name in ("kernels.py", "tpu_suite.py"):
        shutil.copy(REPO / name, pytester.path / name)
    return pytester


def test_the_suite_skips_itself_without_a_tpu(repo):
    """The suite is a TPU-only one: without pallas-check every test is skipped."""
    result = repo.runpytest("-p", "no:cacheprovider", "tpu_suite.py")
    result.assert_outcomes(skipped=len(TESTS))


@pytest.mark.skipif(libtpu_missing() is not None, reason="the chip's compile needs libtpu")
def test_the_suite_runs_green_as_a_v6e(repo):
    """With the chip's compile on (the default where libtpu is installed; the rest of our
    suite turns it off): the test asserting that a TPU refuses Triton's params passes, the
    refusal it caught counted apart and not a finding of that test."""
    junit = repo.path / "junit.xml"
    result = repo.runpytest_subprocess(
        "--pallas-check", "--pallas-check-tpu", "v6e", "--pallas-check-chip-compile",
        "-p", "no:cacheprovider", f"--junitxml={junit}", "tpu_suite.py")
    result.assert_outcomes(passed=len(TESTS))
    assert result.ret == pytest.ExitCode.OK
    calls = {case.get("name"): {p.get("name"): int(p.get("value"))
                                for p in case.iter("property")}
             for case in ElementTree.parse(junit).getroot().iter("testcase")}
    assert sorted(calls) == sorted(TESTS)
    for name, properties in calls.items():
        assert properties["pallas_check_calls"] == CALLS.get(name, 1), name
        assert properties["pallas_check_findings"] == 0, name
        assert properties["pallas_check_refusals_caught"] == (
            1 if name == "test_gpu_params_are_refused" else 0), name


APPEND_BUG = """\
import jax.numpy as jnp
import numpy as np

import kernels
from tpu_suite import CACHE, LENS, NEW


def test_append_tokens_bug():
    out, _ = kernels.append_tokens_bug(jnp.asarray(CACHE), jnp.asarray(NEW), jnp.asarray(LENS),
                                       jnp.asarray([4], jnp.int32))
    rows = [i * kernels.SEQ_ROWS + LENS[i] for i in range(4)]
    np.testing.assert_array_equal(np.asarray(out)[rows], NEW[:4])
"""


def test_a_donating_step_whose_consumer_reads_past_the_schedule_fails(repo):
    """The twin of test_append_tokens_updates_the_donated_cache: its consumer loops one
    sequence too far, so the schedule's first never-written entry picks the cache row
    the extra copy overwrites. The test's own check (the live rows) passes; the program,
    re-run on a copy of the donated cache with the other fill, returns another cache:
    the unwritten entries reach it, and the plugin fails the test on them."""
    repo.makepyfile(test_append_bug=APPEND_BUG)
    result = repo.runpytest("--pallas-check", "--pallas-check-tpu", "v6e",
                            "-p", "no:cacheprovider", "test_append_bug.py")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "pallas-check: 1 finding in test_append_bug.py::test_append_tokens_bug",
        "Output elements never written (1)*",  # the kind's title: unwritten-output
        "pallas-check: 1 finding in 2 pallas_calls"])
    line = 1 + (REPO / "kernels.py").read_text().splitlines().index(
        "def _schedule_kernel(num_ref, lens_ref, slots_ref):")
    assert _table_row(result.stdout.lines) == {
        "#": "1", "kernel": "_schedule_kernel call 0", "buffer": "slots_ref[4:8] (HBM)",
        "grid point": "", "where": f"kernels.py:{line}", "count": "",
        "what": "4 of 8 elements of output slots_ref are never written (within"
                " slots_ref[4:8]) (kept by the program: result 0 of"
                " jax.jit(append_tokens_bug)[0:128, 0:128], 256 elements)"}


def _table_row(lines: list[str]) -> dict[str, str]:
    """The report table's one row, by column: each cell's lines joined (the table wraps
    a long cell over several lines)."""
    header = next(k for k, text in enumerate(lines) if text.startswith("┃ #"))
    names = [c.strip() for c in lines[header].strip("┃").split("┃")]
    cells: list[list[str]] = [[] for _ in names]
    for text in lines[header + 2:]:
        if not text.startswith("│"):
            break
        for k, cell in enumerate(text.strip().strip("│").split("│")):
            if cell.strip():
                cells[k].append(cell.strip())
    return {name: " ".join(parts) for name, parts in zip(names, cells)}


SPILL = """\
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas import tpu_sc as plsc

import per_chip


def test_spill():
    lanes = plsc.get_sparse_core_info().num_lanes
    ids = np.arange(per_chip.SUBCORES * lanes, dtype=np.int32)
    out = np.asarray(per_chip.add_one(jnp.asarray(ids), out_lanes=8))
    np.testing.assert_array_equal(out, ids[:out.shape[0]] + 1)
"""


def test_tpu_all_runs_each_test_again_as_each_generation(pytester):
    """The plugin's --tpu-all: a test that asked which chip it runs on is run again in its
    process as each further generation, and that run checked: the spill only v7x's lanes
    make (tests/scripts/per_chip.py) fails the test; without it, v6e's run passes."""
    shutil.copy(PER_CHIP, pytester.path / "per_chip.py")
    pytester.makepyfile(test_spill=SPILL)
    both = pytester.runpytest("--pallas-check", "--pallas-check-tpu", "v6e,v7x",
                              "--pallas-check-tpu-all", "-p", "no:cacheprovider")
    both.assert_outcomes(failed=1)
    both.stdout.fnmatch_lines([
        "pallas-check: 1 finding in test_spill.py::test_spill",
        "Out-of-bounds accesses (1)*",
        "note: v7x traced by running the code again as that chip in this process: 1 call,"
        " 1 finding kept*"])
    assert "traced as v7x: DMA destination of o_hbm[32:48]" in " ".join(
        both.stdout.str().split())
    first = pytester.runpytest("--pallas-check", "--pallas-check-tpu", "v6e,v7x",
                               "-p", "no:cacheprovider")
    first.assert_outcomes(passed=1)


def test_exact_arithmetic_loses_the_chips_rounding(repo):
    """With --pallas-check-exact-arithmetic the products are float32: the one test that
    holds the kernel to what a TPU computes (a default-precision product about 0.1 from
    exact, measured on a v5e) fails; by default (tests above) all pass, as on the chip."""
    result = repo.runpytest_subprocess(
        "--pallas-check", "--pallas-check-exact-arithmetic", "--pallas-check-no-compile",
        "-p", "no:cacheprovider", "tpu_suite.py", "-k", "matmul")
    result.assert_outcomes(passed=2, failed=1)
    assert "test_matmul_at_default_precision_is_not_float32 FAILED" in result.stdout.str() \
        or "FAILED tpu_suite.py::test_matmul_at_default_precision_is_not_float32" \
        in result.stdout.str()
