"""`pallas-check replay`: recordings made on a CPU (JAX's HLO interpreter standing in for
the chip, tests/commands/test_record.py's fixture), then doctored the ways a real chip's
recording differs from the simulation, and replayed."""

from __future__ import annotations

import dataclasses
import json
import runpy
import textwrap
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from pallas_check.cli.app import app
from pallas_check.commands import recording
from pallas_check.commands.record import Recorder
from pallas_check.config import Config
from pallas_check.intercept.patched_lowering import intercepted
from pallas_check.intercept.session import Session
from pallas_check.config.exitcodes import ExitCode
from pallas_check.tpu_compile.toolchain import libtpu_missing
from commands.test_record import hlo_as_chip  # noqa: F401 (a fixture)

needs_libtpu = pytest.mark.skipif(libtpu_missing() is not None, reason="needs libtpu")

ROOT = Path(__file__).resolve().parents[2]


def make(tmp_path: Path, sample: str, name: str = "r.npz") -> Path:
    """A recording of samples/`sample` made from the repository's root."""
    path = tmp_path / name
    result = CliRunner().invoke(app, ["record", f"samples/{sample}", "-o", str(path)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return path


def replay(path: Path, *args: str) -> tuple[int, dict | None, str]:
    out = path.with_suffix(".json")
    result = CliRunner().invoke(app, ["replay", str(path), *args, "--format", "json",
                                      "-o", str(out)], catch_exceptions=False)
    report = json.loads(out.read_text()) if out.exists() else None
    return result.exit_code, report, result.output


def doctor(path: Path, **changes: object) -> recording.Recording:
    made = recording.read(path)
    made = dataclasses.replace(made, **changes)  # type: ignore[arg-type]
    recording.write(made, path)
    return made


@pytest.fixture
def at_root(monkeypatch, hlo_as_chip):  # noqa: F811
    monkeypatch.chdir(ROOT)


def test_replay_agrees(tmp_path, at_root):
    path = make(tmp_path, "add_ok.py")
    code, report, output = replay(path)
    assert code == 0, output
    assert report["against"] == "the chip (cpu, r.npz)"
    assert report["recording"]["script"] == "samples/add_ok.py"
    assert report["summary"]["mismatching_outputs"] == 0
    assert report["summary"]["disagreements"] == 0 and report["disagreements"] == []
    (call,) = report["calls"]
    assert (call["kernel"], call["findings"], call["disagreement"]) == ("add_kernel", 0, None)


def test_a_doctored_element_disagrees_naming_it(tmp_path, hlo_as_chip, monkeypatch):  # noqa: F811
    # A script that does not check the kernel's outputs (the samples do: the script gets
    # the chip's outputs, and a doctored one fails its assertion, exit 3).
    monkeypatch.chdir(tmp_path)
    (tmp_path / "samples").mkdir()
    (tmp_path / "samples" / "add_ok.py").write_text(textwrap.dedent(f"""
        import runpy
        import jax.numpy as jnp
        add = runpy.run_path({str(ROOT / "samples" / "add_ok.py")!r})["add"]
        x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
        add(x, jnp.ones_like(x))
    """))
    path = make(tmp_path, "add_ok.py")
    made = recording.read(path)
    made.calls[0].outputs[0][3, 5] += 0.5  # 3*128+5 + 1 on the chip: beyond f32's tolerance
    recording.write(made, path)
    code, report, _ = replay(path)
    assert code == ExitCode.FINDINGS
    (output,) = report["calls"][0]["outputs"]
    assert (output["name"], output["mismatches"]) == ("o_ref", 1)
    assert output["first_mismatches"] == [{"index": [3, 5], "ours": 390.0, "theirs": 390.5}]
    result = CliRunner().invoke(app, ["replay", str(path)], catch_exceptions=False)
    assert result.exit_code == ExitCode.FINDINGS
    assert "[3, 5]: 390.0 vs 390.5" in result.output
    # The same element within a tolerance given: agreement.
    assert replay(path, "--atol", "0.6")[0] == 0


def test_garbage_where_ours_never_wrote_is_counted_apart(tmp_path, at_root):
    # The kernel leaves the bucket's last 8 rows unwritten; a chip leaves what was there.
    path = make(tmp_path, "unwritten_padding_sliced_ok.py")
    made = recording.read(path)
    made.calls[0].outputs[0][24:] = 7.0
    recording.write(made, path)
    code, report, output = replay(path)
    assert code == 0, output
    (out,) = report["calls"][0]["outputs"]
    assert (out["mismatches"], out["never_written"]) == (0, 8 * 128)
    assert report["summary"]["never_written_elements"] == 1024
    assert report["summary"]["findings"] == 0  # the caller slices the rows off, as `run` says
    result = CliRunner().invoke(app, ["replay", str(path)], catch_exceptions=False)
    assert "never written: 1024 elements (not compared)" in " ".join(result.output.split())


def test_a_chip_failure_agrees_with_a_finding(tmp_path, at_root):
    # The chip halted at the kernel's call (its executable failed: nothing recorded).
    path = make(tmp_path, "debug_check_bug.py")
    doctor(path, calls=[], script_error="XlaRuntimeError: INTERNAL: TPU halted")
    code, report, output = replay(path)
    assert code == 0, output
    (call,) = report["calls"]
    assert call["findings"] == 1 and call["disagreement"] is None
    assert call["note"] == ("the chip's run failed at this call: XlaRuntimeError: INTERNAL:"
                            " TPU halted; ours reported 1 finding (agree)")
    # ...and a correct kernel the chip failed at: ours finds nothing, they disagree.
    path = make(tmp_path, "add_ok.py", "ok.npz")
    doctor(path, calls=[], script_error="XlaRuntimeError: INTERNAL: TPU halted")
    code, report, _ = replay(path)
    assert code == ExitCode.FINDINGS
    assert report["calls"][0]["disagreement"] == ("the chip's run failed at this call:"
                                                  " XlaRuntimeError: INTERNAL: TPU halted;"
                                                  " ours reported no finding")


def test_a_finding_where_the_chip_ran_disagrees(tmp_path, at_root):
    path = make(tmp_path, "debug_check_bug.py")
    code, report, _ = replay(path)
    assert code == ExitCode.FINDINGS
    assert report["calls"][0]["disagreement"] == (
        "ours reported 1 finding (`pallas-check run` shows them); the chip ran it without"
        " an error")
    # ...unless the recording is of a defect: then the finding is the verdict. A failed
    # `pl.debug_check` explains no output value: the outputs are still compared.
    code, report, output = replay(path, "--expect-findings")
    assert code == 0, output
    (call,) = report["calls"]
    assert (call["disagreement"], call["finding_kinds"]) == (None, ["check-failed"])
    assert call["note"] == ("ours reported 1 finding (check-failed); the chip ran it without"
                            " an error: the defect (--expect-findings)")
    assert [o["explained"] for o in call["outputs"]] == [0]


def test_a_defect_ours_does_not_find_disagrees(tmp_path, at_root):
    path = make(tmp_path, "add_ok.py")
    code, report, _ = replay(path, "--expect-findings")
    assert code == ExitCode.FINDINGS
    assert report["disagreements"] == ["ours reported no finding, and the recording is of a"
                                       " defect (--expect-findings)"]


def test_differences_a_finding_about_values_explains(tmp_path, at_root):
    # The kernel reads an accumulator nobody initialised: where the chip's memory held
    # something else than ours' NaN, the outputs differ, and the finding says why.
    path = make(tmp_path, "uninit_acc_bug.py")
    made = recording.read(path)
    (out,) = made.calls[0].outputs
    out[...] = np.where(np.isnan(out), 0.0, out)  # the chip's scratch held zeros
    recording.write(made, path)
    code, report, _ = replay(path)
    assert code == ExitCode.FINDINGS  # an _ok reading: a finding, and values that differ
    nan_elements = int(report["calls"][0]["outputs"][0]["mismatches"])
    assert nan_elements > 0
    code, report, output = replay(path, "--expect-findings")
    assert code == 0, output
    (o,) = report["calls"][0]["outputs"]
    assert (o["mismatches"], o["explained"]) == (0, nan_elements)
    assert report["summary"]["explained_elements"] == nan_elements


def test_calls_are_matched_by_their_kernel_in_any_order(tmp_path, at_root):
    # Two independent kernels of one jitted program: XLA's TPU scheduler ran the prefill
    # first, XLA:CPU runs the decode first. Each still meets its own recorded call.
    path = make(tmp_path, "unwritten_select_ok.py")
    made = recording.read(path)
    assert [c.kernel for c in made.calls] == ["decode_kernel", "prefill_kernel"]
    made.calls = [dataclasses.replace(c, index=1 - c.index) for c in made.calls[::-1]]
    recording.write(made, path)
    code, report, output = replay(path)
    assert code == 0, output
    notes = [(c["kernel"], c["note"], c["disagreement"]) for c in report["calls"]]
    assert notes == [("decode_kernel", "recorded as call 1: the chip ran the calls in another"
                                       " order", None),
                     ("prefill_kernel", "recorded as call 0: the chip ran the calls in"
                                        " another order", None)]
    assert all(o["mismatches"] == 0 for c in report["calls"] for o in c["outputs"])


def test_other_fingerprint_missing_and_extra_calls(tmp_path, at_root):
    path = make(tmp_path, "add_ok.py")
    made = recording.read(path)
    found = made.calls[0].fingerprint
    made.calls[0].fingerprint = "0123456789abcdef"  # the kernel changed since
    recording.write(made, path)
    code, report, output = replay(path)
    assert code == ExitCode.FINDINGS, output
    (call,) = report["calls"]
    assert call["disagreement"] == (
        f"fingerprint {found} differs from the recorded call's 0123456789abcdef"
        f" (add_kernel at samples/add_ok.py:9): the kernel or its shapes changed since it"
        f" was recorded")
    assert call["outputs"] == [] and report["disagreements"] == []
    # A recorded call the script no longer makes (the same kernel once more).
    made.calls = [dataclasses.replace(made.calls[0], fingerprint=found),
                  dataclasses.replace(made.calls[0], fingerprint=found, index=1)]
    recording.write(made, path)
    code, report, _ = replay(path)
    assert code == ExitCode.FINDINGS
    assert report["calls"][0]["disagreement"] is None
    assert report["disagreements"] == ["call 1 (add_kernel at samples/add_ok.py:9) is in"
                                       " the recording, but the script did not make it"]
    doctor(path, calls=[])
    code, report, _ = replay(path)
    assert code == ExitCode.FINDINGS
    assert report["calls"][0]["disagreement"] == ("not in the recording (it holds 0 calls"
                                                  " on device 0)")


def test_operands_the_script_computed_otherwise_get_ours(tmp_path, at_root):
    # The chip computed the script's operands with its own arithmetic (a transcendental's
    # last bits): the chip's outputs are those of its operands, not of the script's, and
    # the script checking them against its own reference would fail where it passed on
    # the chip. Ours on the recorded operands agrees with the chip; the script gets ours
    # on its own operands.
    path = make(tmp_path, "add_ok.py")
    made = recording.read(path)
    call = made.calls[0]
    call.inputs[0] += 0.25
    call.outputs[0] += 0.25  # the chip's sum of its own operands
    recording.write(made, path)
    code, report, output = replay(path)
    assert code == 0, output  # the script's own assert_allclose passed
    assert report["calls"][0]["outputs"][0]["mismatches"] == 0


def test_a_script_getting_zeros_where_ours_never_wrote_is_judged_again(tmp_path, at_root):
    # The schedule kernel leaves slots [3:8] unwritten; the chip's memory held 0 there
    # (as a v5e's did: hardware/recordings/bugs/donated_schedule_bug.npz), one of our two
    # fills: the judge's re-run must still give the program other values than the chip's,
    # or the defect would look as if the program never kept them.
    path = make(tmp_path, "donated_schedule_bug.py")
    made = recording.read(path)
    schedule, append = made.calls
    schedule.outputs[0][3:] = 0
    append.inputs[1][3:] = 0  # the append kernel got the chip's slots
    recording.write(made, path)
    code, report, output = replay(path, "--expect-findings")
    assert code == 0, output
    assert [c["finding_kinds"] for c in report["calls"]] == [["unwritten-output"], []]


def test_an_empty_array_stays_never_written_on_the_recorded_operands(tmp_path, at_root):
    # The script's carry is `jnp.empty`: on the recorded operands (the chip's bits of that
    # memory) ours still reads never-written memory.
    path = make(tmp_path, "empty_carry_bug.py")
    code, report, output = replay(path, "--expect-findings")
    assert code == 0, output
    assert [c["finding_kinds"] for c in report["calls"]] == [["uninitialized"], [], []]


@needs_libtpu
def test_the_chips_compile_refusal_is_ours_too(tmp_path, at_root):
    # On a v5e the program failed to compile (E1001: the output block is v5e's whole
    # scoped VMEM): nothing was recorded. Replay compiles the call for the recording's
    # chip as it is lowered, as `run` does: the same refusal, at the same call.
    path = tmp_path / "vmem.npz"
    recording.write(recording.Recording(
        script="samples/compile_vmem_bug.py", args=[], chip="TPU v5 lite", platform="tpu",
        versions=recording.versions(), calls=[],
        script_error="JaxRuntimeError: RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom"),
        path)
    code, report, output = replay(path, "--tpu", "v6e")  # the recording's chip wins
    assert code == 0, output
    (call,) = report["calls"]
    assert (call["kernel"], call["finding_kinds"]) == ("gram_kernel", ["vmem-exceeded"])
    assert call["note"].startswith("the chip's run failed at this call: JaxRuntimeError:")
    assert report["ours"]["tpu"] == "v5e" and report["user_error"] is None


DRAWS = """
import jax, jax.numpy as jnp, numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def noise_kernel(seed_ref, x_ref, o_ref, bits_ref):
    pltpu.prng_seed(seed_ref[0])
    o_ref[...] = x_ref[...] + 1.0
    bits_ref[...] = pltpu.stateful_bits((8, 128), jnp.uint32)


def plus_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 2.0


x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
spec = pl.BlockSpec((8, 128), lambda i, s: (0, 0))
out, bits = pl.pallas_call(
    noise_kernel, out_shape=[jax.ShapeDtypeStruct((8, 128), jnp.float32),
                             jax.ShapeDtypeStruct((8, 128), jnp.uint32)],
    grid_spec=pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(1,),
                                           in_specs=[spec], out_specs=[spec, spec]),
)(jnp.array([7], jnp.int32), x)
plus = pl.pallas_call(plus_kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))(x)
np.testing.assert_array_equal(out, x + 1.0)
np.testing.assert_array_equal(plus, x + 2.0)
"""


def recorded_by_ours(script: str, path: Path, chip) -> None:
    """A recording of `script` with our own engine standing in for the chip (JAX's HLO
    interpreter has no PRNG), `chip` making the chip's outputs of ours'."""
    recorder, session = Recorder(), Session(Config())

    def handler(params, operands, device=0, mesh_axes=()):
        ours = session.handle_call(params, operands, device, mesh_axes)
        return recorder.handle_call(params, operands, device, mesh_axes, native=chip(ours))

    with intercepted(handler):
        runpy.run_path(script, run_name="__main__")
    recording.write(recording.Recording(script=script, args=[], chip="cpu", platform="cpu",
                                        versions=recording.versions(),
                                        calls=recorder.recorded()), path)


def test_outputs_drawn_from_the_prng_are_not_compared(tmp_path, monkeypatch):
    # The chip's generator draws other bits than ours: a call that drew from it has its
    # outputs' shapes and dtypes compared, not their values; the other call is compared.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "draws.py").write_text(DRAWS)
    path = tmp_path / "r.npz"
    recorded_by_ours("draws.py", path, lambda ours: [
        o ^ np.uint32(0x5A5A5A5A) if o.dtype == np.uint32 else o for o in ours])
    code, report, output = replay(path)
    assert code == 0, output
    noise, plus = report["calls"]
    assert [(o["name"], o["drawn"], o["mismatches"], o["max_abs"]) for o in noise["outputs"]
            ] == [("o_ref", True, 0, None), ("bits_ref", True, 0, None)]
    assert [(o["drawn"], o["mismatches"]) for o in plus["outputs"]] == [(False, 0)]
    assert report["summary"]["drawn_outputs"] == 2
    result = CliRunner().invoke(app, ["replay", str(path)], catch_exceptions=False)
    assert "drawn from the chip's PRNG: 2 outputs (not compared)" in " ".join(
        result.output.split())
    # ...but an output of another dtype than the chip's differs.
    made = recording.read(path)
    made.calls[0].outputs[1] = made.calls[0].outputs[1].view(np.int32)
    recording.write(made, path)
    code, report, _ = replay(path)
    assert code == ExitCode.FINDINGS
    (bits,) = [o for o in report["calls"][0]["outputs"] if o["name"] == "bits_ref"]
    assert (bits["mismatches"], bits["note"]) == (
        8 * 128, "the other side's shape and dtype are (8, 128) int32")


def test_bad_recordings_are_one_line(tmp_path, at_root):
    (tmp_path / "x.npz").write_bytes(b"junk")
    for target, message in ((tmp_path / "x.npz", f"{tmp_path / 'x.npz'} is not a readable"
                             " pallas-check recording"),
                            (tmp_path / "none.npz", f"recording not found: {tmp_path}")):
        result = CliRunner().invoke(app, ["replay", str(target)])
        assert result.exit_code == ExitCode.USAGE
        (line,) = result.output.strip().splitlines()
        assert line.startswith(f"pallas-check: error: {message}"), line
    path = make(tmp_path, "add_ok.py")
    doctor(path, script="elsewhere/add_ok.py")
    result = CliRunner().invoke(app, ["replay", str(path)])
    assert result.exit_code == ExitCode.USAGE
    assert "the recorded script elsewhere/add_ok.py is not found from" in result.output
