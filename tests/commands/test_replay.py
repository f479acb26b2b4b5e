"""`pallas-check replay`: recordings made on a CPU (JAX's HLO interpreter standing in for
the chip, tests/commands/test_record.py's fixture), then doctored the ways a real chip's
recording differs from the simulation, and replayed."""

from __future__ import annotations

import dataclasses
import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from pallas_check.cli.app import app
from pallas_check.commands import recording
from pallas_check.config.exitcodes import ExitCode
from commands.test_record import hlo_as_chip  # noqa: F401 (a fixture)

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


def test_other_fingerprint_missing_and_extra_calls(tmp_path, at_root):
    path = make(tmp_path, "add_ok.py")
    made = recording.read(path)
    made.calls[0].fingerprint = "0123456789abcdef"
    made.calls.append(dataclasses.replace(made.calls[0], index=1))
    recording.write(made, path)
    code, report, output = replay(path)
    assert code == ExitCode.FINDINGS, output
    (call,) = report["calls"]
    found = recording.read(make(tmp_path, "add_ok.py", "again.npz")).calls[0].fingerprint
    assert call["disagreement"] == (
        f"fingerprint {found} differs from the recorded call's 0123456789abcdef"
        f" (add_kernel at samples/add_ok.py:9): the kernel or its shapes changed since it"
        f" was recorded")
    assert call["outputs"] == []
    assert report["disagreements"] == ["call 1 (add_kernel at samples/add_ok.py:9) is in"
                                       " the recording, but the script did not make it"]
    doctor(path, calls=[])
    code, report, _ = replay(path)
    assert code == ExitCode.FINDINGS
    assert report["calls"][0]["disagreement"] == ("not in the recording (it holds 0 calls"
                                                  " on device 0)")


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
