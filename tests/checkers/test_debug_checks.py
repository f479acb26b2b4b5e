"""The kernel author's own checks and prints (issue #29, section 1).

`pl.debug_check` is evaluated whether or not `pl.enable_debug_checks()` is on: a failing
one is a `check-failed` finding (its message with its values, line, device, core, grid
point; merged over steps with a count), a passing one is silent. `pl.debug_print` lines are
written by the session, prefixed with who printed them, in simulated order, off a JSON
report's stdout, and dropped by `--quiet-prints`.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from typer.testing import CliRunner

from pallas_check.cli.app import app
from pallas_check.config import Config
from pallas_check.intercept.session import Session

# A 4-step kernel: a check on the step index, and a print per step. {CHECK} and {WITH}
# are filled in per test; the check's line is CHECK_LINE of the written script.
_SCRIPT = '''\
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify
from jax.experimental import pallas as pl


def step_kernel(x_ref, o_ref):
    i = pl.program_id(0)
    {CHECK}
    pl.debug_print("step {{}}", i)
    o_ref[...] = x_ref[...] + 1.0


def call(x):
    return pl.pallas_call(
        step_kernel, grid=(4,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


x = jnp.zeros((32, 128), jnp.float32)
{WITH}
    out = jax.jit(call)(x)
np.testing.assert_allclose(out, np.ones((32, 128)))
print("script done")
'''
CHECK_LINE = 10


def _script(tmp_path: Path, check: str, enabled: bool) -> Path:
    text = _SCRIPT.format(CHECK=check,
                          WITH="with pl.enable_debug_checks(True):" if enabled else "if True:")
    path = tmp_path / "kernel_with_check.py"
    path.write_text(text)
    return path


@pytest.mark.parametrize("enabled", [False, True], ids=["checks-off", "enable_debug_checks"])
def test_a_failing_check_is_a_finding_at_its_step(cli, tmp_path, enabled):
    # Two checks on the line: the one that holds is silent.
    path = _script(tmp_path, 'pl.debug_check(i < 4, "inside the grid");'
                   ' pl.debug_check(i != 3, "step 3 is not allowed")', enabled)
    result = cli("run", str(path))
    assert result.exit_code == 1, result.output
    (finding,) = result.findings
    assert finding["kind"] == "check-failed"
    assert "step 3 is not allowed" in finding["message"]
    assert finding["grid_point"] == [3]
    assert finding["frames"][0]["line"] == CHECK_LINE
    assert Path(finding["frames"][0]["file"]).resolve() == path.resolve()
    assert finding["actor"] == "core 0"
    assert finding["details"]["device"] == 0 and finding["details"]["core"] == 0
    assert finding["count"] == 1
    assert "script done" in result.output  # the kernel ran on, as with checks compiled out


def test_a_check_fails_with_its_values_and_is_merged_over_steps(cli, tmp_path):
    """checkify.debug_check's format arguments are the values at the failing step; the same
    check failing at two steps is one finding counted twice, at its first step."""
    path = _script(tmp_path, 'checkify.debug_check(i % 2 == 0, "odd step {}", i)', False)
    result = cli("run", str(path))
    assert result.exit_code == 1, result.output
    (finding,) = result.findings
    assert finding["kind"] == "check-failed"
    assert "odd step 1" in finding["message"]
    assert finding["grid_point"] == [1]
    assert finding["count"] == 2


def test_a_passing_check_is_silent(cli, tmp_path):
    path = _script(tmp_path, 'pl.debug_check(i < 4, "inside the grid")', True)
    result = cli("run", str(path))
    assert result.exit_code == 0, result.output
    assert result.findings == []
    assert len(_print_lines(result.output)) == 4  # the kernel ran every step


def _print_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("[dev ")]


def test_prints_are_prefixed_in_simulated_order(cli, tmp_path):
    path = _script(tmp_path, "pass", False)
    result = cli("run", str(path))
    assert result.exit_code == 0, result.output
    assert _print_lines(result.output) == [f"[dev 0 core 0 ({i},)] step {i}"
                                           for i in range(4)]
    # Before the script's own print that follows the call (written when the call returns).
    assert result.output.index("step 3") < result.output.index("script done")


def test_prints_stay_off_a_json_report_on_stdout(tmp_path):
    path = _script(tmp_path, "pass", False)
    result = CliRunner().invoke(app, ["run", "--format", "json", str(path)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)  # stdout is the report alone
    assert report["findings"] == []
    assert len(_print_lines(result.stderr)) == 4


def test_quiet_prints_drops_them(cli, tmp_path):
    path = _script(tmp_path, 'pl.debug_check(i != 3, "step 3 is not allowed")', False)
    result = cli("run", "--quiet-prints", str(path))
    assert _print_lines(result.output) == []
    assert "step" not in re.sub(r"step 3 is not allowed", "", result.output).replace(
        "script done", "")
    assert [f["kind"] for f in result.findings] == ["check-failed"]  # checks still run
    assert result.report["config"]["quiet_prints"] is True


def test_prints_name_the_core_of_a_megacore_split():
    """--cores 2: the parallel axis is split over the cores; each line names its core and
    grid point, each core's lines in its own grid order, and nothing is printed twice."""
    from jax.experimental.pallas import tpu as pltpu

    def kernel(x_ref, o_ref):
        pl.debug_print("i={} j={}", pl.program_id(0), pl.program_id(1))
        o_ref[...] = x_ref[...]

    def call(x):
        return pl.pallas_call(
            kernel, grid=(2, 2),
            in_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, j))],
            out_specs=pl.BlockSpec((8, 128), lambda i, j: (i, j)),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            compiler_params=pltpu.CompilerParams(
                dimension_semantics=("parallel", "arbitrary")))(x)

    lines: list[str] = []
    session = Session(Config(cores=2))
    session.print_sink = lines.append
    x = jnp.arange(16 * 256, dtype=jnp.float32).reshape(16, 256)
    with session.install():
        out = jax.block_until_ready(call(x))
    np.testing.assert_array_equal(out, x)
    assert sorted(lines) == ["[dev 0 core 0 (0, 0)] i=0 j=0", "[dev 0 core 0 (0, 1)] i=0 j=1",
                             "[dev 0 core 1 (1, 0)] i=1 j=0", "[dev 0 core 1 (1, 1)] i=1 j=1"]
    for core in ("core 0", "core 1"):
        mine = [line for line in lines if core in line]
        assert mine == sorted(mine)


def test_a_call_re_run_prints_once():
    """A kernel reading never-written scratch is simulated again with the other fill (to
    see whether it reaches an output): its prints are the reported run's only."""
    from jax.experimental.pallas import tpu as pltpu

    def kernel(x_ref, o_ref, acc_ref):
        pl.debug_print("acc row {}", acc_ref[0, 0])  # never written: NaN, then 0
        o_ref[...] = x_ref[...]

    def call(x):
        return pl.pallas_call(
            kernel, grid=(2,),
            in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32)])(x)

    lines: list[str] = []
    session = Session(Config())
    session.print_sink = lines.append
    with session.install():
        jax.block_until_ready(call(jnp.ones((16, 128), jnp.float32)))
    assert lines == ["[dev 0 core 0 (0,)] acc row nan", "[dev 0 core 0 (1,)] acc row nan"]


@pytest.mark.parametrize("quiet", [False, True], ids=["prints", "quiet-prints"])
def test_quiet_prints_records_nothing(quiet):
    """With --quiet-prints the engine does not even record the kernel's prints; a kernel
    with no grid is named by its device and core alone."""
    def kernel(x_ref, o_ref):
        pl.debug_print("first {}", x_ref[0, 0])
        pl.debug_print("corner {}", x_ref[:2, :2])  # two lines, each prefixed
        o_ref[...] = x_ref[...]

    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))
    lines: list[str] = []
    session = Session(Config(quiet_prints=quiet))
    session.print_sink = lines.append
    with session.install():
        jax.block_until_ready(call(jnp.full((8, 128), 7, jnp.int32).astype(jnp.float32)))
    assert lines == ([] if quiet else ["[dev 0 core 0] first 7.0",
                                        "[dev 0 core 0] corner [[7. 7.]\n"
                                        "[dev 0 core 0]  [7. 7.]]"])


def test_skip_floats_judges_no_check():
    """--skip-floats computes no float values (they read as inf): a check that may be about
    them cannot be judged, so none is, rather than failing on values never computed."""
    def kernel(x_ref, o_ref):
        y = x_ref[...] * 2.0
        pl.debug_check(jnp.all(jnp.isfinite(y)), "finite")
        pl.debug_print("step {}", pl.program_id(0))
        o_ref[...] = y

    call = pl.pallas_call(kernel, grid=(2,), in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                          out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
                          out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32))
    lines: list[str] = []
    session = Session(Config(skip_floats=True))
    session.print_sink = lines.append
    with session.install():
        jax.block_until_ready(call(jnp.ones((16, 128), jnp.float32)))
    assert session.findings == []
    assert lines == ["[dev 0 core 0 (0,)] step 0", "[dev 0 core 0 (1,)] step 1"]


@pytest.mark.parametrize("args", ["--dma random --schedules 20 --races", "--dma eager --races"],
                         ids=["random-20", "eager"])
def test_debug_check_samples_in_every_dma_mode(cli, sample, args):
    """The fixed sample is clean (its check holds), the bug's check fails at step 2 only,
    whichever way DMAs land."""
    ok = cli("run", *args.split(), sample("debug_check_ok.py"))
    assert ok.exit_code == 0 and ok.findings == [], ok.findings
    assert "output matches" in ok.output
    bug = cli("run", *args.split(), sample("debug_check_bug.py"))
    assert bug.exit_code == 1
    assert [(f["kind"], f["grid_point"], f["count"]) for f in bug.findings] == [
        ("check-failed", [2], 1)]



def test_prints_before_an_engine_failure_are_written():
    """A call the engine cannot finish (a signal aimed at an axis the call does not have,
    reached at step 1: a one-line error, exit 4) still shows what its kernel printed up to
    there."""
    def kernel(x_ref, o_ref, sem):
        i = pl.program_id(0)
        pl.debug_print("step {}", i)
        o_ref[...] = x_ref[...]

        @pl.when(i == 1)
        def _():
            pl.semaphore_signal(sem, 1, device_id={"nope": 0})

    call = pl.pallas_call(kernel, grid=(2,), in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                          out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
                          out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32),
                          scratch_shapes=[pltpu.SemaphoreType.REGULAR])
    lines: list[str] = []
    session = Session(Config())
    session.print_sink = lines.append
    with session.install(), pytest.raises(Exception):
        jax.block_until_ready(call(jnp.ones((16, 128), jnp.float32)))
    assert session.engine_error is not None
    assert lines == ["[dev 0 core 0 (0,)] step 0", "[dev 0 core 0 (1,)] step 1"]
