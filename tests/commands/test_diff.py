"""`pallas-check diff` and `pallas-check run --native`.

Most runs go through typer's CliRunner in this process (JAX is imported once); two run the
real command in a subprocess to see that a missing accelerator is one line on stderr and
exit 2. The hardware side of `--native` cannot run on a CPU; its plumbing (the hardware
lowering compiled next to our callback, the operands recorded for timing) is exercised
here with JAX's HLO interpreter standing in for the hardware (`NATIVE_INTERPRET = True`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from pallas_check.cli.app import app
from pallas_check.findings.output_diff import compare

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "samples"


def diff(tmp_path: Path, *args: str) -> tuple[int, dict | None, str]:
    out = tmp_path / f"diff-{len(list(tmp_path.iterdir()))}.json"
    result = CliRunner().invoke(app, ["diff", *args, "--format", "json", "--output", str(out)],
                                catch_exceptions=False)
    report = json.loads(out.read_text()) if out.exists() else None
    return result.exit_code, report, result.output


def only_output(report: dict) -> dict:
    (call,) = report["calls"]
    (output,) = call["outputs"]
    return output


@pytest.mark.parametrize("name", ["add_ok.py", "uninit_acc_ok.py", "unwritten_half_ok.py",
                                  "output_revisited_ok.py"])
def test_correct_samples_match_the_hlo_interpreter(tmp_path, name):
    code, report, output = diff(tmp_path, str(SAMPLES / name), "--against", "hlo")
    assert code == 0, output
    assert report["against"] == "hlo"
    assert report["summary"]["calls"] >= 1
    assert report["summary"]["mismatching_outputs"] == 0
    assert all(o["mismatches"] == 0 and o["first_mismatches"] == []
               for c in report["calls"] for o in c["outputs"])


def test_padding_read_shows_under_another_fill(tmp_path):
    # The kernel sums the NaN padding of the last block into every column (ours: NaN); with
    # zero padding the same sums are the true column sums of the 20 rows.
    code, report, _ = diff(tmp_path, str(SAMPLES / "uninit_padding_bug.py"),
                           "--against", "--uninit zero")
    assert code == 1
    out = only_output(report)
    assert (out["name"], out["shape"], out["dtype"]) == ("o_ref", [8, 128], "float32")
    assert out["mismatches"] == 8 * 128
    first = out["first_mismatches"][0]
    assert first["index"] == [0, 0]
    assert first["ours"] == "nan"
    assert first["theirs"] == float(np.arange(20 * 128).reshape(20, 128)[:, 0].sum())
    assert report["against_config"]["uninit"] == "zero"


def test_padding_read_against_hlo(tmp_path):
    # JAX's HLO interpreter pads edge blocks with NaN for floats
    # (primitives.uninitialized_value), as our default `--uninit nan` does, and NaN equals
    # NaN: both sides agree, so the padding read does not show against hlo by default...
    bug = str(SAMPLES / "uninit_padding_bug.py")
    code, report, _ = diff(tmp_path, bug, "--against", "hlo")
    assert code == 0 and report["summary"]["mismatching_outputs"] == 0
    assert report["summary"]["findings"] >= 1  # ...though our run still reports the read
    # ...and it does once our side pads with zeros: every column sum differs.
    code, report, _ = diff(tmp_path, bug, "--against", "hlo", "--uninit", "zero")
    assert code == 1
    out = only_output(report)
    assert out["mismatches"] == 8 * 128
    assert out["first_mismatches"][0]["theirs"] == "nan"


def test_dma_read_before_wait_shows_against_eager_dmas(tmp_path):
    code, report, _ = diff(tmp_path, str(SAMPLES / "dma_read_before_wait_bug.py"),
                           "--against", "--dma eager")
    assert code == 1
    out = only_output(report)
    assert out["mismatches"] == 16 * 128
    assert out["first_mismatches"][1] == {"index": [0, 1], "ours": "nan", "theirs": 2.0}


def test_table_report(tmp_path):
    result = CliRunner().invoke(app, ["diff", str(SAMPLES / "dma_read_before_wait_bug.py"),
                                      "--against", "hlo"], catch_exceptions=False)
    assert result.exit_code == 1
    assert "2048 of 2048" in result.output
    assert "[0, 1]: nan vs 2.0" in result.output
    assert "1 of 1 output differs in 1 pallas_call" in result.output


@pytest.mark.parametrize("against", ["tpu", "--uninit nan", "--devices 2", "--dma sideways",
                                     "--tier sideways"])
def test_bad_against_is_a_usage_error(tmp_path, against):
    code, report, output = diff(tmp_path, str(SAMPLES / "add_ok.py"), "--against", against)
    assert code == 2 and report is None
    assert "Traceback" not in output


def test_against_another_tier_is_our_side_on_that_tier():
    """`diff --tier compiled --against "--tier engine"`: the compiled tier held to the
    engine, call by call; the tier already in use is refused as nothing would differ."""
    from pallas_check.commands.sides import ConfigSide, parse_against
    from pallas_check.config import Config, Tier
    from pallas_check.config.errors import UsageError

    side = parse_against("--tier engine", Config(tier=Tier.COMPILED))
    assert isinstance(side, ConfigSide) and side.config == Config(tier=Tier.ENGINE)
    with pytest.raises(UsageError, match="already in use"):
        parse_against("--tier auto", Config())


def test_script_failure_is_exit_3(tmp_path):
    script = tmp_path / "boom.py"
    script.write_text("raise RuntimeError('boom')\n")
    code, report, _ = diff(tmp_path, str(script), "--against", "hlo")
    assert code == 3
    assert report["user_error"] == "RuntimeError: boom"


def test_compare_rules():
    nan = np.float32("nan")
    a = np.array([1.0, nan, np.inf, 2.0], np.float32)
    assert compare(a, a.copy()).mismatches == 0  # NaN equals NaN, inf equals inf
    b = np.array([1.0 + 1e-7, nan, np.inf, 3.0], np.float32)
    d = compare(a, b)
    assert (d.mismatches, d.max_abs) == (1, 1.0)
    assert d.max_rel == pytest.approx(1 / 3)  # relative to the other side's value
    assert [(m.index, m.ours, m.theirs) for m in d.first] == [((3,), 2.0, 3.0)]
    assert compare(a, b, atol=1.0).mismatches == 0
    d = compare(np.array([1.0], np.float32), np.array([nan], np.float32))
    assert d.mismatches == 1 and d.max_abs == float("inf")
    assert compare(np.arange(4), np.array([0, 1, 2, 4])).first[0].index == (3,)
    assert compare(np.zeros((2, 2)), np.zeros(4)).mismatches == 4


# ---------------------------------------------------------------- --native


def test_native_on_a_cpu_only_machine_is_one_line_and_exit_2():
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    expected = "pallas-check: error: --native needs a TPU or GPU backend; this machine has: cpu"
    for argv in (["diff", "--native"], ["run", "--native"]):
        proc = subprocess.run([sys.executable, "-m", "pallas_check", argv[0],
                               str(SAMPLES / "add_ok.py"), *argv[1:]],
                              capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 2, proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith(expected) and "--compile" in line, line
        assert proc.stdout == ""


def test_diff_defaults_to_native(tmp_path):
    code, report, output = diff(tmp_path, str(SAMPLES / "add_ok.py"))
    assert code == 2 and report is None
    assert "--native needs a TPU or GPU backend" in output


@pytest.fixture
def hlo_as_hardware(monkeypatch):
    """The native modes' plumbing, with JAX's HLO interpreter as the 'hardware'."""
    import pallas_check.intercept.patched_lowering
    import pallas_check.commands.native

    monkeypatch.setattr(pallas_check.intercept.patched_lowering, "NATIVE_INTERPRET", True)
    monkeypatch.setattr(pallas_check.commands.native, "native_unavailable", lambda: None)


def test_native_diff_plumbing(tmp_path, hlo_as_hardware):
    code, report, output = diff(tmp_path, str(SAMPLES / "add_ok.py"), "--native")
    assert code == 0, output
    assert report["against"] == "native"
    assert only_output(report)["mismatches"] == 0
    code, report, _ = diff(tmp_path, str(SAMPLES / "dma_read_before_wait_bug.py"))
    assert code == 1
    assert only_output(report)["first_mismatches"][0] == {"index": [0, 0], "ours": "nan",
                                                         "theirs": 0.0}


def test_run_native_plumbing(tmp_path, hlo_as_hardware):
    script = tmp_path / "twice.py"
    script.write_text(textwrap.dedent(f"""
        import runpy, sys
        mod = runpy.run_path({str(SAMPLES / "add_ok.py")!r})
        import jax.numpy as jnp
        x = jnp.ones((16, 128), jnp.float32)
        out = mod["add"](x, x)  # eager, then under jit below
        assert float(out[0, 0]) == 2.0, out  # the script sees the hardware's outputs
        jax_out = __import__("jax").jit(mod["add"])(x, 2 * x)
        assert float(jax_out[0, 0]) == 3.0
    """))
    out = tmp_path / "timing.json"
    result = CliRunner().invoke(app, ["run", str(script), "--native", "--format", "json",
                                      "-o", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["schema"] == "pallas-check/native-timing"
    assert [c["kernel"] for c in report["calls"]] == ["add_kernel", "add_kernel"]
    for call in report["calls"]:
        assert call["not_timed"] is None
        assert call["runs"] == 5 and 0 < call["best_s"] <= call["median_s"]
        assert call["compile_s"] > 0


def test_never_written_elements_are_counted_apart(tmp_path):
    # The last 8 rows are never written: NaN on our side, 0.0 under `--uninit zero` (as a
    # chip leaves what memory held). Not mismatches; and the caller slices them off, so
    # ours reports no finding, as `run` does.
    sample = str(SAMPLES / "unwritten_padding_sliced_ok.py")
    code, report, output = diff(tmp_path, sample, "--against", "--uninit zero")
    assert code == 0, output
    out = only_output(report)
    assert (out["mismatches"], out["never_written"]) == (0, 8 * 128)
    assert report["summary"]["never_written_elements"] == 1024
    assert report["summary"]["findings"] == 0
    result = CliRunner().invoke(app, ["diff", sample, "--against", "hlo"],
                                catch_exceptions=False)
    assert result.exit_code == 0
    assert "Our run also reported" not in result.output
