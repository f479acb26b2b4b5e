"""`pytest --pallas-check-replay DIR`: each hardware recording in a collected folder is a test
that replays it (`pallas-check replay` in a process of its own) and fails with the
disagreement. Recordings made on a CPU with JAX's HLO interpreter standing in for the chip
(tests/commands/test_record.py's fixture)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from pallas_check.commands import recording
from commands.test_record import hlo_as_chip  # noqa: F401 (a fixture)
from commands.test_replay import ROOT, make

pytest_plugins = ["pytester"]


def _suite(pytester, tmp_path, monkeypatch) -> Path:
    """A repository with samples/add_ok.py and its recording under recordings/."""
    monkeypatch.chdir(ROOT)
    made = make(tmp_path, "add_ok.py", "add.npz")
    (pytester.path / "samples").mkdir()
    shutil.copy(ROOT / "samples" / "add_ok.py", pytester.path / "samples")
    (pytester.path / "recordings").mkdir()
    target = pytester.path / "recordings" / "add.npz"
    shutil.copy(made, target)
    monkeypatch.chdir(pytester.path)
    return target


def test_a_recording_that_agrees_passes(pytester, tmp_path, monkeypatch, hlo_as_chip):  # noqa: F811
    _suite(pytester, tmp_path, monkeypatch)
    result = pytester.runpytest("--pallas-check-replay", "-p", "no:cacheprovider",
                                "recordings")
    result.assert_outcomes(passed=1)
    assert any("replay[add.npz]" in line or "add.npz" in line for line in result.outlines)


def test_a_recording_that_disagrees_fails_naming_the_output(pytester, tmp_path, monkeypatch,
                                                            hlo_as_chip):  # noqa: F811
    target = _suite(pytester, tmp_path, monkeypatch)
    made = recording.read(target)
    out = made.calls[0].outputs[0]
    out.reshape(-1)[5] += 1000.0
    recording.write(made, target)
    result = pytester.runpytest("--pallas-check-replay", "-p", "no:cacheprovider",
                                "recordings")
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    # the chip's (doctored) output, fed to the script, also fails its own check: exit 3
    assert "pallas-check replay add.npz exited 3" in text
    assert "call 0 add_kernel: output o_ref" in text and "[0, 5]: 6.0 vs 1006.0" in text


def test_without_the_option_a_recording_is_no_test(pytester, tmp_path, monkeypatch,
                                                   hlo_as_chip):  # noqa: F811
    _suite(pytester, tmp_path, monkeypatch)
    result = pytester.runpytest("-p", "no:cacheprovider", "recordings")
    assert result.ret == 5  # no tests collected
    assert np.load(pytester.path / "recordings" / "add.npz").files  # left as it was
