"""The suite row's floor (benchmarks/suite.py, benchmarks/_suite_one.py): the script with
every kernel call answered from a recording, so that each mode's time less the floor is
what running its kernels adds. These check that the floor runs the script's own work and
no kernel, and that the totals subtract it as the README says."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SAMPLES = BENCHMARKS.parent / "samples"
sys.path.insert(0, str(BENCHMARKS))
import suite  # noqa: E402


def _one(mode: str, sample: str, recording: Path, tmp_path: Path) -> dict:
    out = tmp_path / f"{mode}.json"
    subprocess.run(
        [sys.executable, str(BENCHMARKS / "_suite_one.py"), "--mode", mode, "--case", sample,
         "--path", str(SAMPLES / f"{sample}.py"), "--options=", "--out", str(out),
         "--recording", str(recording)],
        check=True, capture_output=True, timeout=300, env=suite.child_env(""))
    return json.loads(out.read_text())


def test_the_floor_answers_each_kernel_with_its_recorded_outputs(tmp_path):
    """unwritten_select_ok runs two kernels on the same inputs (the key tells them apart by
    their function); the floor replays them and the script's check passes. With the
    recorded outputs changed the check fails: the floor used them, it ran no kernel."""
    recording = tmp_path / "outputs.pickle"
    recorded = _one("record", "unwritten_select_ok", recording, tmp_path)
    assert recorded["ok"], recorded["error"]
    kept = pickle.loads(recording.read_bytes())
    assert len(kept) == 2  # decode and prefill, each called once
    assert _one("floor", "unwritten_select_ok", recording, tmp_path)["ok"]

    recording.write_bytes(pickle.dumps(
        {key: [[np.zeros_like(o) for o in outs] for outs in calls]
         for key, calls in kept.items()}))
    replayed = _one("floor", "unwritten_select_ok", recording, tmp_path)
    assert not replayed["ok"]
    assert replayed["error"].startswith("AssertionError")


def test_what_the_kernels_add_is_each_mode_less_the_floor():
    cases = [suite.Case(n, Path(n), "") for n in ("a", "b", "c")]
    seconds = {("a", "pc"): 3.0, ("a", "tpu-interp"): 9.0, ("a", "floor"): 2.0,
               ("b", "pc"): 1.5, ("b", "tpu-interp"): 2.0, ("b", "floor"): 1.0,
               # No floor for c (its outputs could not be recorded): in the pc/TPU ratio,
               # not in what the kernels add.
               ("c", "pc"): 1.0, ("c", "tpu-interp"): 4.0}
    results = {key: {"status": "ok", "seconds": s} for key, s in seconds.items()}
    results[("c", "floor")] = {"status": "skipped", "seconds": None}
    summed = suite.totals(cases, results, ("pc", "tpu-interp", "floor"))
    assert summed["pc_seconds"] == 5.5 and summed["tpu_seconds"] == 15.0
    assert summed["floor_cases"] == 2 and summed["floor_seconds"] == 3.0
    assert summed["pc_added_seconds"] == 1.5 and summed["tpu_added_seconds"] == 8.0
    assert summed["pc_added_over_tpu_added"] == 1.5 / 8.0
    assert "ratio 0.188 (<= 0.333: met)" in "\n".join(suite.summary(summed, ("pc",)))
