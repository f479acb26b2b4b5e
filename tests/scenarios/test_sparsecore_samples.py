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


def test_compiling_for_two_generations_says_the_script_was_traced_for_the_first(cli):
    """sc_lookup_ok's kernel is traced with v6e's 8 lanes; v7x's SparseCore wants 16: the
    v7x failure comes with the note that says why and what to run instead."""
    path = SAMPLES / "sc_lookup_ok.py"
    both = cli("compile", str(path), "--tpu", "v6e,v7x")
    assert both.exit_code == 1, both.output
    text = " ".join(both.output.split())
    assert "v7x: Get only supports int32 arrays of shapes [(16,)], got (8,)" in text
    assert ("note: the script ran once, with get_tpu_info() answering for v6e" in text
            and "compile it with `--tpu GEN` alone" in text), both.output
    alone = cli("compile", str(path), "--tpu", "v7x")
    assert alone.exit_code == 0, alone.output
    assert "note: the script ran once" not in alone.output
