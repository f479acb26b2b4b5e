"""`pallas-check record`: a hardware recording written on a CPU, JAX's HLO interpreter
standing in for the chip (`NATIVE_INTERPRET = True`, as tests/commands/test_diff.py's
native plumbing does); the file read back; bad input one line, exit 2."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from pallas_check.cli.app import app
from pallas_check.commands import recording
from pallas_check.config.exitcodes import ExitCode

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "samples"


@pytest.fixture
def hlo_as_chip(monkeypatch):
    """The recorder's plumbing, with JAX's HLO interpreter as the 'chip'."""
    import pallas_check.commands.record
    import pallas_check.intercept.patched_lowering

    monkeypatch.setattr(pallas_check.intercept.patched_lowering, "NATIVE_INTERPRET", True)
    monkeypatch.setattr(pallas_check.commands.record, "record_unavailable", lambda: None)


def record(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["record", *args], catch_exceptions=False)
    return result.exit_code, result.output


def test_record_keeps_operands_and_the_chips_outputs(tmp_path, hlo_as_chip, monkeypatch):
    monkeypatch.chdir(ROOT)
    path = tmp_path / "add.npz"
    code, output = record("samples/add_ok.py", "-o", str(path), "--format", "json")
    assert code == 0, output
    report = json.JSONDecoder().raw_decode(output[output.index("{"):])[0]
    assert report["schema"] == "pallas-check/record"
    assert report["recording"] == str(path) and report["bytes"] == path.stat().st_size
    (call,) = report["calls"]
    assert (call["kernel"], call["file"], call["line"]) == ("add_kernel",
                                                           "samples/add_ok.py", 9)
    with np.load(path, allow_pickle=False) as archive:
        assert sorted(archive.files) == ["c0_in0", "c0_in1", "c0_out0", "meta"]
        meta = json.loads(str(archive["meta"]))
    assert meta["format"] == "pallas-check/recording" and meta["version"] == 1
    assert meta["script"] == "samples/add_ok.py" and meta["script_error"] is None
    assert meta["chip"] == "cpu" and meta["versions"]["jax"]
    made = recording.read(path)
    (kept,) = made.calls
    x = np.arange(32 * 128, dtype=np.float32).reshape(32, 128)
    np.testing.assert_array_equal(kept.inputs[0], x)
    np.testing.assert_array_equal(kept.inputs[1], np.ones_like(x))
    np.testing.assert_array_equal(kept.outputs[0], x + 1)
    assert kept.grid == (4,) and kept.fingerprint == call["fingerprint"]
    assert len(kept.fingerprint) == 16


def test_fingerprint_is_the_structure_not_the_place(tmp_path, hlo_as_chip):
    # The same kernel from another file and folder: the same fingerprint; other shapes
    # (a bf16 call with a grid of 2): another. bf16 arrays come back as bf16.
    copy = tmp_path / "moved.py"
    copy.write_text((SAMPLES / "add_ok.py").read_text())
    two = tmp_path / "two.py"
    two.write_text(textwrap.dedent(f"""
        import runpy
        import jax.numpy as jnp
        mod = runpy.run_path({str(SAMPLES / "add_ok.py")!r})
        x = jnp.ones((16, 128), jnp.bfloat16)
        mod["add"](x, x)
        raise ValueError("boom after the call")
    """))
    assert record(str(SAMPLES / "add_ok.py"), "-o", str(tmp_path / "a.npz"))[0] == 0
    assert record(str(copy), "-o", str(tmp_path / "b.npz"))[0] == 0
    code, output = record(str(two), "-o", str(tmp_path / "c.npz"))
    assert code == ExitCode.USER_ERROR, output  # the script's failure, recording written
    a, b, c = (recording.read(tmp_path / f"{n}.npz") for n in "abc")
    assert a.calls[0].fingerprint == b.calls[0].fingerprint != c.calls[0].fingerprint
    assert c.script_error == "ValueError: boom after the call"
    assert c.calls[0].inputs[0].dtype.name == "bfloat16"
    assert c.calls[0].outputs[0].dtype.name == "bfloat16"
    assert float(c.calls[0].outputs[0][0, 0]) == 2.0


def test_record_needs_a_tpu(tmp_path):
    code, output = record(str(SAMPLES / "add_ok.py"), "-o", str(tmp_path / "r.npz"))
    assert code == ExitCode.USAGE
    assert output.strip() == ("pallas-check: error: record needs a TPU backend; this machine"
                              " has: cpu (`pallas-check replay` replays a recording on any"
                              " CPU)")
    assert not (tmp_path / "r.npz").exists()


@pytest.mark.parametrize("args, message", [
    (["missing.py", "-o", "r.npz"], "script not found: missing.py"),
    (["k.py", "-o", "k.py"], "--output k.py is the script itself; refusing to overwrite it"),
    (["k.py", "-o", "folder"], "--output folder is a folder, not a file"),
    (["k.py", "-o", "-"], "--output -: a recording is a file (the report goes to stdout)"),
    (["k.py", "-o", "no/such/dir/r.npz"], "cannot create --output no/such/dir/r.npz: "),
])
def test_bad_input_is_one_line(tmp_path, monkeypatch, hlo_as_chip, args, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "k.py").write_text("open('ran.txt', 'w').close()\n")
    (tmp_path / "folder").mkdir()
    code, output = record(*args)
    assert code == ExitCode.USAGE
    (line,) = output.strip().splitlines()
    assert line.startswith(f"pallas-check: error: {message}"), line
    assert not (tmp_path / "ran.txt").exists()
    assert (tmp_path / "k.py").read_text() == "open('ran.txt', 'w').close()\n"


def test_a_file_that_is_no_recording(tmp_path):
    (tmp_path / "x.npz").write_bytes(b"not a zip")
    with pytest.raises(recording.RecordingError, match="is not a readable pallas-check"
                                                       " recording"):
        recording.read(tmp_path / "x.npz")
    np.savez_compressed(tmp_path / "y.npz", meta=np.array(json.dumps({"format": "other"})))
    with pytest.raises(recording.RecordingError, match="is not a pallas-check recording"):
        recording.read(tmp_path / "y.npz")


ONE_CORE = '''
import jax, jax.numpy as jnp, numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

MESH = pltpu.create_tensorcore_mesh("core", num_cores=1)


def double(x):
    @pl.kernel(out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), mesh=MESH,
               scratch_types=[pltpu.VMEM(x.shape, jnp.float32)])
    def double_kernel(x_hbm, o_hbm, buf):
        pltpu.sync_copy(x_hbm, buf)
        buf[...] = buf[...] * 2.0
        pltpu.sync_copy(buf, o_hbm)

    return double_kernel(x)


x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
np.testing.assert_allclose(jax.jit(double)(x), x * 2)
'''


def test_a_core_map_kernel_is_recorded_and_replays(tmp_path, hlo_as_chip, monkeypatch):
    # A `pl.kernel` over a TensorCore mesh is checked by `run`; record keeps it too (on a
    # TPU through mpmd_map's own lowering: tests/jaxbridge/test_lowering.py), and replay
    # simulates it on the recorded operands. (One core: JAX's HLO interpreter, the chip
    # here, has no core axis.)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "one_core.py").write_text(ONE_CORE)
    code, output = record("one_core.py", "-o", "r.npz")
    assert code == 0, output
    (call,) = recording.read(tmp_path / "r.npz").calls
    x = np.arange(16 * 128, dtype=np.float32).reshape(16, 128)
    assert (call.kernel, call.grid) == ("double_kernel", (1,))
    np.testing.assert_array_equal(call.inputs[0], x)
    np.testing.assert_array_equal(call.outputs[0], x * 2)
    result = CliRunner().invoke(app, ["replay", "r.npz"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "0 of 1 output differ in 1 pallas_call" in result.output
