"""A ref indexed by an array of indices (a gather or scatter) does not lower on TPU: the
kernel's defect, not pallas-check's. It is a `compile-error` finding at the user's line,
with or without --compile; the call is skipped (outputs: the fill, an aliased output its
input), and the run goes on (exit 1, never exit 4)."""

from __future__ import annotations

import inspect
import json
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_check.engine.call import explore
from pallas_check.engine.jaxpr.mosaic_limits import MOSAIC_LOAD_STORE, MOSAIC_REF_SLICE
from pallas_check.config.exitcodes import ExitCode

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
_VMEM = pl.BlockSpec(memory_space=pltpu.VMEM)
_ANY = pl.BlockSpec(memory_space=pl.ANY)
IDS = jnp.array([3, 1, 4, 1, 5, 9, 2, 6], jnp.int32)
X = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)


def _line_of(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    [hit] = [first + k for k, line in enumerate(lines) if text in line]
    return hit


def _gather(ids_ref, x_ref, o_ref):
    o_ref[...] = x_ref[ids_ref[...], :]  # the gather


def _scatter(ids_ref, x_ref, o_ref):
    o_ref[...] = jnp.zeros_like(o_ref)
    o_ref[ids_ref[...], :] = x_ref[pl.ds(0, 8), :]  # the gather


def _gather_never_run(ids_ref, x_ref, o_ref):
    o_ref[...] = x_ref[pl.ds(0, 8), :]

    @pl.when(ids_ref[0] > 100)  # no grid step takes it: the lowering fails all the same
    def _():
        o_ref[...] = x_ref[ids_ref[...], :]  # the gather


def _gather_in_a_loop(ids_ref, x_ref, o_ref):
    def body(i, carry):
        o_ref[...] = x_ref[ids_ref[...] + i, :]  # the gather
        return carry
    jax.lax.fori_loop(0, 2, body, 0)


def _dma_gather(ids_ref, x_hbm, o_ref, sem):
    copy = pltpu.make_async_copy(x_hbm.at[ids_ref[...]], o_ref, sem)
    copy.start()  # the gather
    copy.wait()


_CASES = {
    "load": (_gather, "x_ref", "VMEM", "load", MOSAIC_LOAD_STORE, False),
    "store": (_scatter, "o_ref", "VMEM", "store", MOSAIC_LOAD_STORE, False),
    "branch-never-taken": (_gather_never_run, "x_ref", "VMEM", "load", MOSAIC_LOAD_STORE,
                           False),
    "loop-body": (_gather_in_a_loop, "x_ref", "VMEM", "load", MOSAIC_LOAD_STORE, False),
    "dma-source": (_dma_gather, "x_hbm", "HBM", "DMA source", MOSAIC_REF_SLICE, True),
}


def _call(kernel, dma: bool):
    if dma:
        return pl.pallas_call(kernel, in_specs=[_VMEM, _ANY], out_specs=_VMEM,
                              out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                              scratch_shapes=[pltpu.SemaphoreType.DMA(())])
    return pl.pallas_call(kernel, in_specs=[_VMEM, _VMEM], out_specs=_VMEM,
                          out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))


# Only the look before running sees a branch never taken; DMAs have no guard of their own.
_WHEN = [(case, "before-running") for case in _CASES] + [
    (case, "while-running") for case in ("load", "store", "loop-body")]


@pytest.mark.parametrize("case,found", _WHEN)
def test_a_ref_indexed_by_an_array_is_a_compile_error_and_the_call_is_skipped(
        check, monkeypatch, case, found):
    """Found by looking at the kernel before it runs; a load or store also when met
    while running (the rules' own guard, for a spelling the look would miss), but for a
    branch never taken, which only the look can see."""
    kernel, buffer, space, operation, mosaic, dma = _CASES[case]
    if found == "while-running":
        monkeypatch.setattr(explore, "_not_lowered", lambda params, tpu: None)
    r = check(_call(kernel, dma), IDS, X)
    [finding] = r.findings
    assert finding.kind.value == "compile-error"
    assert (finding.buffer, finding.memory_space) == (buffer, space)
    assert finding.details["operation"] == operation and finding.details["mosaic"] == mosaic
    assert finding.frames[0].line == _line_of(kernel, "# the gather")
    assert finding.frames[0].function.startswith(kernel.__name__)
    assert mosaic in finding.message and "the call is skipped" in finding.message
    assert np.isnan(np.asarray(r.value)).all()  # never written: the fill


def _aliased(ids_ref, x_ref, counts_ref, o_ref, counts_out):
    o_ref[...] = x_ref[ids_ref[...], :]
    counts_out[...] = counts_ref[...] + 1


def test_a_skipped_call_returns_the_fill_and_an_aliased_output_its_input(check):
    counts = jnp.arange(8 * 128, dtype=jnp.int32).reshape(8, 128)
    call = pl.pallas_call(
        _aliased, in_specs=[_VMEM, _VMEM, _VMEM], out_specs=(_VMEM, _VMEM),
        out_shape=(jax.ShapeDtypeStruct((8, 128), jnp.int32),
                   jax.ShapeDtypeStruct((8, 128), jnp.int32)),
        input_output_aliases={2: 1})
    r = check(call, IDS, X.astype(jnp.int32), counts)
    gathered, kept = (np.asarray(v) for v in r.value)
    assert (gathered == np.iinfo(np.int32).max).all()  # int32's fill
    np.testing.assert_array_equal(kept, np.asarray(counts))  # the kernel never ran
    assert r.kinds() == ["compile-error"]


_SCRIPT = """
    import jax, jax.numpy as jnp, numpy as np
    from jax.experimental import pallas as pl

    def gather_kernel(ids_ref, x_ref, o_ref):
        o_ref[...] = x_ref[ids_ref[...], :]

    def half_kernel(x_ref, o_ref):
        o_ref[:4, :] = x_ref[:4, :]

    x = jnp.ones((16, 128), jnp.float32)
    out = pl.pallas_call(gather_kernel, out_shape=jax.ShapeDtypeStruct((8, 128),
                         jnp.float32))(jnp.arange(8, dtype=jnp.int32), x)
    assert np.isnan(np.asarray(out)).all()
    pl.pallas_call(half_kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))(
        x[:8]).block_until_ready()
    print("the run went on")
"""


def test_the_run_goes_on_after_a_call_that_does_not_lower(cli, tmp_path):
    path = tmp_path / "gather.py"
    path.write_text(textwrap.dedent(_SCRIPT))
    result = cli("run", str(path))
    assert result.exit_code == ExitCode.FINDINGS, result.output
    assert result.report["internal_error"] is None and result.report["user_error"] is None
    assert "the run went on" in result.output
    compile_error, unwritten = result.findings
    assert (compile_error["kind"], compile_error["buffer"], compile_error["call_index"],
            compile_error["frames"][0]["line"]) == ("compile-error", "x_ref", 0, 6)
    assert (unwritten["kind"], unwritten["call_index"]) == ("unwritten-output", 1)
    assert [(c["kernel"], c["failed"]) for c in result.report["calls"]] == [
        ("gather_kernel", False), ("half_kernel", False)]


def test_with_compile_the_compilers_verdict_is_the_same_one_finding(cli):
    """libtpu compiles the call for v6e: Mosaic refuses it too; one finding, the
    simulation's (the compiler's, placed at the same line, joins it), and the call's
    compile status says so. The fixed twin's spelling compiles."""
    fixed = cli("run", str(SAMPLES / "vmem_gather_ok.py"), "--compile", "--tpu", "v6e")
    assert fixed.exit_code == 0 and fixed.findings == [], fixed.output
    assert fixed.report["calls"][0]["compiled"]["v6e"]["status"] == "ok"
    path = SAMPLES / "vmem_gather_bug.py"
    result = cli("run", str(path), "--compile", "--tpu", "v6e")
    assert result.exit_code == ExitCode.FINDINGS, result.output
    [finding] = result.findings
    assert (finding["kind"], finding["buffer"], finding["frames"][0]["line"]) == (
        "compile-error", "table_ref", 23)
    assert finding["details"]["skipped"] is True
    [call] = result.report["calls"]
    assert call["compiled"]["v6e"]["status"] == "compile-error" and not call["failed"]


def test_the_compilers_words_are_placed_at_the_gather(check):
    """`pallas-check compile` (no simulation): Mosaic's error has no location; it is
    placed where the simulation would place it, on the ref it indexes."""
    from pallas_check.config import Config
    from pallas_check.tpu_compile.diagnose import diagnose
    from pallas_check.tpu_compile.locate import place
    from pallas_check.tpu_compile.stage import RecordedCall

    r = check(_call(_scatter, False), IDS, X, config=Config(compile=True))
    [recorded] = r.session.compile_recorder.calls
    for said in (f"ValueError: {MOSAIC_LOAD_STORE}",
                 f"VerificationError: Pallas ... Error details: {MOSAIC_REF_SLICE}, but"):
        diagnosis = diagnose(said)
        assert diagnosis.kind == "compile-error" and diagnosis.array_index

        class Outcome:
            lowered_ir = None

        Outcome.diagnosis = diagnosis
        frame, buffer = place(RecordedCall(**vars(recorded)), Outcome())
        assert (frame.line, buffer) == (_line_of(_scatter, "# the gather"), "o_ref")


@pytest.mark.parametrize("mode", [("--dma", "random", "--schedules", "20", "--races"),
                                  ("--dma", "eager"), ("--dma", "on_wait", "--races")])
def test_the_gather_samples_under_every_dma_mode(cli, mode):
    """The fixed twin stays clean and the bug keeps its one finding however DMAs land."""
    fixed = cli("run", str(SAMPLES / "vmem_gather_ok.py"), *mode)
    assert fixed.exit_code == 0 and fixed.findings == [], fixed.output
    bug = cli("run", str(SAMPLES / "vmem_gather_bug.py"), *mode)
    assert bug.exit_code == ExitCode.FINDINGS
    assert [(f["kind"], f["buffer"], f["frames"][0]["line"]) for f in bug.findings] == [
        ("compile-error", "table_ref", 23)]


def test_another_backends_compiler_params_are_a_compile_error(cli, tmp_path):
    """Triton's CompilerParams on a TPU call: refused by the TPU lowering (an assertion
    without words), reported before the call runs at the line that made it, with and
    without --compile (one finding: libtpu's joins it), and by `pallas-check compile` in
    words; the twin with pltpu.CompilerParams compiles and runs clean."""
    from pallas_check.engine.jaxpr.mosaic_limits import MOSAIC_FOREIGN_PARAMS

    path = SAMPLES / "compile_params_bug.py"
    for extra in ((), ("--compile", "--tpu", "v5e,v7x")):
        result = cli("run", str(path), *extra)
        assert result.exit_code == ExitCode.FINDINGS, result.output
        [finding] = result.findings
        assert (finding["kind"], finding["buffer"], finding["frames"][0]["line"]) == (
            "compile-error", "", 25)
        assert finding["message"].startswith(
            "compiler_params are Triton's CompilerParams on a TPU pallas_call")
        assert finding["details"] == {"operation": "compiler_params",
                                      "mosaic": MOSAIC_FOREIGN_PARAMS, "skipped": True}
        assert "never written" in finding["message"]
    assert {g: e["status"] for g, e in result.report["calls"][0]["compiled"].items()} == {
        "v5e": "compile-error", "v7x": "compile-error"}
    report = tmp_path / "compile.json"
    cli("compile", str(path), "--tpu", "v5e", "--format", "json", "--output", str(report))
    [finding] = json.loads(report.read_text())["findings"]
    assert finding["message"].startswith("v5e: compiler_params are Triton's CompilerParams")
    fixed = cli("run", str(SAMPLES / "compile_params_ok.py"), "--compile", "--tpu", "v5e")
    assert fixed.exit_code == 0 and fixed.findings == [], fixed.output
    assert fixed.report["calls"][0]["compiled"]["v5e"]["status"] == "ok"
