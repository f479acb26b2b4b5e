"""`--kernel GLOB` and `--calls N` (issue 29): only the selected calls are checked, the
others pass through unchecked with the outputs a checked run gives; the report counts
both per kernel, and the replay command repeats the filters."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_check.config import Config

pytest_plugins = ["pytester"]

LOOP = Path(__file__).resolve().parents[1] / "scripts" / "filters_loop.py"
STEPS = 4
LEAK_LINE = 40  # `pltpu.semaphore_signal(sem, 1)` in filters_loop.py


def _reference() -> np.ndarray:
    """filters_loop.py's final state, computed in numpy (to rounding: XLA divides the
    start by 100 its own way): each step is x * 0.5 + 1 + 0.25."""
    x = (np.arange(16 * 128, dtype=np.float32).reshape(16, 128) / np.float32(100))
    for _ in range(STEPS):
        x = (x * np.float32(0.5) + np.float32(1.0)) + np.float32(0.25)
    return x


def _run(cli, tmp_path: Path, *options: str):
    out = tmp_path / f"out-{len(list(tmp_path.iterdir()))}.npy"
    result = cli("run", *options, str(LOOP), "--", str(STEPS), str(out),
                 json_report="text" not in options)
    return result, np.load(out)


def _kernels(report: dict) -> dict[str, tuple[int, int]]:
    return {k["kernel"]: (k["checked"], k["passed_through"]) for k in report["kernels"]}


def test_calls_1_reports_the_first_calls_bug_and_passes_later_calls_through(cli, tmp_path):
    result, outputs = _run(cli, tmp_path, "--calls", "1")
    assert result.exit_code == 1, result.output
    [leak] = result.report["findings"]
    assert leak["kind"] == "semaphore-leak" and leak["buffer"] == "sem"
    assert leak["frames"][0]["line"] == LEAK_LINE
    assert leak["count"] == 1  # the first call only: the later three were not checked
    assert leak["call_index"] == 1  # the loop's second pallas_call (scale, then leak)
    assert _kernels(result.report) == {"leak_kernel": (1, 3), "scale_kernel": (1, 3)}
    assert [c["kernel"] for c in result.report["calls"]] == ["scale_kernel", "leak_kernel"]
    # The script saw the outputs an unfiltered run gives (and the right ones).
    full, full_outputs = _run(cli, tmp_path)
    assert full.report["findings"][0]["count"] == STEPS
    assert _kernels(full.report) == {"leak_kernel": (STEPS, 0), "scale_kernel": (STEPS, 0)}
    np.testing.assert_array_equal(outputs, full_outputs)
    np.testing.assert_allclose(outputs, _reference(), rtol=1e-6)


def test_passed_through_outputs_equal_jaxs_own_interpreter(cli, tmp_path):
    _, outputs = _run(cli, tmp_path, "--calls", "1")
    reference = tmp_path / "interpret.npy"
    subprocess.run([sys.executable, str(LOOP), str(STEPS), str(reference)], check=True,
                   env={**os.environ, "FILTERS_LOOP_INTERPRET": "1"}, capture_output=True)
    np.testing.assert_array_equal(outputs, np.load(reference))


def test_kernel_selects_one_of_two_kernels(cli, tmp_path):
    clean, outputs = _run(cli, tmp_path, "--kernel", "scale*")
    assert clean.exit_code == 0, clean.output
    assert clean.report["findings"] == []
    assert _kernels(clean.report) == {"leak_kernel": (0, STEPS), "scale_kernel": (STEPS, 0)}
    np.testing.assert_allclose(outputs, _reference(), rtol=1e-6)

    leaky, _ = _run(cli, tmp_path, "--kernel", "leak_*", "--kernel", "nothing")
    assert leaky.exit_code == 1
    [leak] = leaky.report["findings"]
    assert leak["kind"] == "semaphore-leak" and leak["count"] == STEPS
    assert _kernels(leaky.report) == {"leak_kernel": (STEPS, 0), "scale_kernel": (0, STEPS)}


def test_the_replay_line_repeats_the_filters(cli, tmp_path):
    result, _ = _run(cli, tmp_path, "--kernel", "leak*", "--calls", "2")
    [leak] = result.report["findings"]
    assert leak["count"] == 2
    assert "--kernel 'leak*' --calls 2 --seed 0" in leak["replay"], leak["replay"]
    text, _ = _run(cli, tmp_path, "--kernel", "leak*", "--calls", "2", "--format", "text")
    assert "--kernel 'leak*' --calls 2" in text.output
    assert ("1 finding in 2 pallas_calls; 6 passed through unchecked (leak_kernel: 2"
            " checked, 2 passed through; scale_kernel: 4 passed through)") in text.output


def test_a_kernel_glob_that_selects_nothing_checks_nothing(cli, tmp_path):
    result, outputs = _run(cli, tmp_path, "--kernel", "flash*", "--format", "text")
    assert result.exit_code == 5, result.output
    assert ("no pallas_call was checked: --kernel selected none of the kernels called"
            " (leak_kernel, scale_kernel)") in result.output
    np.testing.assert_allclose(outputs, _reference(), rtol=1e-6)


# -- the XLA path of a pure kernel: its outputs are the engine's ----------------------------

def _accumulate_kernel(x_ref, o_ref, acc_ref):
    """A reduction over the grid's last axis into scratch, written at its last step: the
    XLA path must carry scratch and the revisited output block across steps, and answer
    program_id / num_programs."""
    k = pl.program_id(1)

    @pl.when(k == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += x_ref[...] * (pl.program_id(0) + 1).astype(jnp.float32)

    @pl.when(k == pl.num_programs(1) - 1)
    def _():
        o_ref[...] = acc_ref[...]


@jax.jit
def _accumulate(x):
    return pl.pallas_call(
        _accumulate_kernel, grid=(2, 4),
        in_specs=[pl.BlockSpec((None, 8, 128), lambda i, k: (i, k, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i, k: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32),
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32)],
    )(x)


def _expected(x: np.ndarray) -> np.ndarray:
    return np.concatenate([x[i].reshape(4, 8, 128).sum(axis=0) * (i + 1) for i in range(2)])


def test_a_pure_kernel_passed_through_runs_as_xla_with_the_engines_outputs(check):
    xs = [np.random.default_rng(seed).standard_normal((2, 32, 128)).astype(np.float32)
          for seed in range(3)]
    checked = [np.asarray(check(_accumulate, x).value) for x in xs]
    run = check(lambda: [np.asarray(_accumulate(x)) for x in xs],
                config=Config(calls=1))
    assert len(run.session.calls) == 1
    assert run.session.call_filter.passed_through() == {"_accumulate_kernel": 2}
    # The two calls passed through went the XLA way, and gave the engine's outputs.
    [fast] = [f for f in run.session._xla_paths.values()]
    assert fast is not None
    for x, engine_out, filtered_out in zip(xs, checked, run.value):
        np.testing.assert_allclose(filtered_out, engine_out, rtol=1e-6)
        np.testing.assert_allclose(filtered_out, _expected(x), rtol=1e-5, atol=1e-5)


def test_a_kernel_with_a_semaphore_or_dma_never_takes_the_xla_path():
    from pallas_check.intercept.patched_lowering import intercepted
    from pallas_check.intercept.xla_path import compiled_call

    params = []

    def keep(p, operands, *args, **kwargs):
        params.append(p)
        return [np.zeros(a.shape, a.dtype) for a in p["out_avals"]]

    sys.path.insert(0, str(LOOP.parent))
    try:
        import filters_loop
    finally:
        sys.path.pop(0)
    with intercepted(keep):
        jax.block_until_ready(filters_loop.step(jnp.zeros((16, 128), jnp.float32)))
    scale, leak = params  # the step's two calls, in order
    assert "scale_kernel" in str(scale["jaxpr"].debug_info)
    assert compiled_call(scale, "nan") is not None
    assert compiled_call(leak, "nan") is None  # its semaphore: the engine's


def test_the_python_api_takes_the_filters():
    import pallas_check

    x = jnp.zeros((2, 32, 128), jnp.float32)
    with pallas_check.checking(calls=1, kernel=["_acc*"], project=False) as run:
        for _ in range(3):
            jax.block_until_ready(_accumulate(x))
    assert len(run.report.calls) == 1
    assert run.report.passed_through == {"_accumulate_kernel": 2}


@pytest.mark.parametrize("calls", [0, 2])
def test_calls_0_checks_every_call(check, calls):
    x = np.ones((2, 32, 128), np.float32)
    run = check(lambda: [_accumulate(x) for _ in range(3)], config=Config(calls=calls))
    assert len(run.session.calls) == (3 if calls == 0 else 2)


LOOP_TEST = """\
import sys

import jax.numpy as jnp
import numpy as np

sys.path.insert(0, {folder!r})
import filters_loop


def test_loop():
    x = jnp.zeros((16, 128), jnp.float32)
    for _ in range(3):
        x = filters_loop.step(x)
    np.asarray(x)
"""


def test_the_pytest_plugin_takes_the_filters(pytester):
    import pallas_check.run.runner  # noqa: F401  (kept across pytester's in-process runs)

    pytester.makepyfile(test_loop=LOOP_TEST.format(folder=str(LOOP.parent)))
    (pytester.path / "pyproject.toml").write_text('[tool.pallas-check]\ncalls = 1\n')
    flagged = pytester.runpytest("--pallas-check", "-p", "no:cacheprovider")
    flagged.assert_outcomes(failed=1)  # the first call's leak
    flagged.stdout.fnmatch_lines(["*1 finding in 2 pallas_calls; 4 passed through unchecked"
                                  " (leak_kernel: 1 checked, 2 passed through;"
                                  " scale_kernel: 1 checked, 2 passed through)*"])
    only_scale = pytester.runpytest("--pallas-check", "--pallas-check-kernel", "scale*",
                                    "-p", "no:cacheprovider")
    only_scale.assert_outcomes(passed=1)


# -- more kernels: a call passed through returns what a checked call returns ---------------

def _in_place_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0 + pl.program_id(0).astype(jnp.float32)


def _in_place(x):
    return pl.pallas_call(
        _in_place_kernel, grid=(4,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        input_output_aliases={0: 0},
    )(x)


def _two_outputs_kernel(x_ref, sum_ref, twice_ref):
    def body(i, total):
        return total + x_ref[pl.ds(i, 1), :]

    sum_ref[...] = jax.lax.fori_loop(0, 8, body, jnp.zeros((1, 128), jnp.float32))
    twice_ref[...] = x_ref[...] * 2.0


def _two_outputs(x):
    return pl.pallas_call(
        _two_outputs_kernel, grid=(4,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=[pl.BlockSpec((1, 128), lambda i: (i, 0)),
                   pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_shape=[jax.ShapeDtypeStruct((4, 128), jnp.float32),
                   jax.ShapeDtypeStruct((32, 128), jnp.float32)],
    )(x)


def _nested_program_id_kernel(x_ref, o_ref):
    @pl.when(x_ref[0, 0] > -1e30)
    def _():
        o_ref[...] = x_ref[...] + pl.program_id(0).astype(jnp.float32)


def _nested_program_id(x):
    return pl.pallas_call(
        _nested_program_id_kernel, grid=(4,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)


def _half_written_kernel(x_ref, o_ref):
    o_ref[0:4, :] = x_ref[0:4, :]  # rows 4:8 of every block never written (a defect)


def _half_written(x):
    return pl.pallas_call(
        _half_written_kernel, grid=(4,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)


@pytest.mark.parametrize("fn, by_xla, uninit", [
    (_in_place, True, "nan"),
    (_two_outputs, True, "nan"),
    (_nested_program_id, False, "nan"),  # program_id inside a cond: the engine's
    (_half_written, True, "nan"),
    (_half_written, True, "zero"),
], ids=["aliased", "two-outputs-fori", "nested-program-id", "unwritten-nan",
        "unwritten-zero"])
def test_calls_passed_through_return_what_checked_calls_return(check, fn, by_xla, uninit):
    from pallas_check.config import UninitFill

    xs = [np.random.default_rng(seed).standard_normal((32, 128)).astype(np.float32)
          for seed in range(3)]
    jitted = jax.jit(fn)
    fill = UninitFill(uninit)
    checked = [jax.tree.map(np.asarray, check(jitted, x, config=Config(uninit=fill)).value)
               for x in xs]
    run = check(lambda: [jax.tree.map(np.asarray, jitted(x)) for x in xs],
                config=Config(calls=1, uninit=fill))
    assert len(run.session.calls) == 1
    assert (list(run.session._xla_paths.values())[0] is not None) == by_xla
    for expected, got in zip(checked, run.value):
        for e, g in zip(jax.tree.leaves(expected), jax.tree.leaves(got)):
            np.testing.assert_allclose(g, e, rtol=1e-6)  # NaN where the engine has NaN
