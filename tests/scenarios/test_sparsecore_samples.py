"""Every SparseCore `_ok` sample (samples/sc_*_ok.py, globbed: a new one is covered as it
lands) is clean however its DMAs land and with the race checker on, and compiles for real
SparseCores (v6e: 8 lanes, v7x: 16) with libtpu's compile-only devices: a kernel the chip
would refuse is no example of a correct one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scenarios.test_samples import _describe, _run, run_args

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
SC_OKS = sorted(SAMPLES.glob("sc_*_ok.py"))


def test_there_are_sparsecore_samples():
    assert len(SC_OKS) >= 10, SC_OKS


@pytest.mark.parametrize("path", SC_OKS, ids=lambda p: p.stem)
def test_sc_ok_sample_is_clean_under_random_dma_and_races(cli, path):
    args = run_args(path).split()
    args = [a for a in args if a != "--races"]  # added below, once
    result = _run(cli, path, " ".join([*args, "--dma", "random", "--schedules", "20",
                                       "--races"]))
    assert result.report is not None, result.output
    assert result.report["user_error"] is None, result.report["user_traceback"]
    assert result.findings == [], _describe(result.findings)
    assert result.exit_code == 0, result.output
    assert "output matches" in result.output


@pytest.mark.parametrize("generation", ["v6e", "v7x"])
@pytest.mark.parametrize("path", SC_OKS, ids=lambda p: p.stem)
def test_sc_ok_sample_compiles_with_its_vmem_footprint(cli, tmp_path, path, generation):
    """One generation a run: the script is traced once, for the first `--tpu` generation,
    and a SparseCore kernel's shapes follow that generation's lane count."""
    out = tmp_path / f"{generation}.json"
    result = cli("compile", str(path), "--tpu", generation, "--format", "json",
                 "--output", str(out))
    report = json.loads(out.read_text())
    assert result.exit_code == 0, [f["message"] for f in report["findings"]]
    assert report["findings"] == [] and report["calls"], result.output
    for call in report["calls"]:
        entry = call["compiled"][generation]
        assert entry["status"] == "ok", entry
        # The compiler's own figure is 0 for most SparseCore kernels; the scratch is ours.
        footprint = (entry["vmem_used_bytes"], entry["vmem_scratch_bytes"])
        assert all(isinstance(n, int) and n >= 0 for n in footprint), entry
        assert max(footprint) <= entry["vmem_capacity_bytes"], entry


def test_compiling_for_two_generations_traces_each_as_itself(cli, tmp_path):
    """sc_lookup_ok's wrapper takes its lane count from the chip (8 on v6e, 16 on v7x):
    compiled for v6e and v7x, each generation is traced by a run of the script as that
    chip (v7x's in a process of its own), so v7x compiles its own 16-lane kernel, not v6e's
    8-lane one (which its SparseCore refuses: "Get only supports int32 arrays of shapes
    [(16,)], got (8,)"); the report says how each was traced and how long it took."""
    path = SAMPLES / "sc_lookup_ok.py"
    out = tmp_path / "both.json"
    both = cli("compile", str(path), "--tpu", "v6e,v7x", "--format", "json", "--output",
               str(out))
    report = json.loads(out.read_text())
    assert both.exit_code == 0, [f["message"] for f in report["findings"]]
    [call] = report["calls"]
    assert {g: (e["status"], e["vmem_capacity_bytes"]) for g, e in call["compiled"].items()} \
        == {"v6e": ("ok", 256 * 1024), "v7x": ("ok", 512 * 1024)}
    # Three lane-wide scratch vectors and a 40-entry table: 8 lanes on v6e, 16 on v7x.
    assert [call["compiled"][g]["vmem_scratch_bytes"] for g in ("v6e", "v7x")] == [
        40 * 4 + 3 * 8 * 4, 40 * 4 + 3 * 16 * 4]
    traces = report["traces"]
    assert [(g, t["own_process"], t["calls"]) for g, t in traces.items()] == [
        ("v6e", False, 1), ("v7x", True, 1)]
    # Each run checks its results: `compile` answers with zeros, after the one call.
    assert all(t["script_error"].startswith("AssertionError") for t in traces.values())
    assert traces["v7x"]["process_seconds"] > traces["v7x"]["seconds"] > 0
