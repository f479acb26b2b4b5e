"""SparseCore meshes (issue 28): `pl.kernel` over `plsc.VectorSubcoreMesh` /
`ScalarSubcoreMesh`, every subcore an actor (`sparsecore C subcore S`), `axis_index`,
VMEM_SHARED one per SparseCore, per-subcore VMEM capacity per generation, the one-line
refusal of a chip without SparseCores, and compiling through the SparseCore lowering.

Each script runs in a process of its own: the chip (`--tpu`) is read when the mesh is
built, and several CPU devices need XLA_FLAGS before JAX starts."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from _cli_worker import run_cli
from pallas_check.config.exitcodes import ExitCode

ROOT = Path(__file__).resolve().parents[3]
MESH = ROOT / "tests" / "scripts" / "sparsecore_mesh.py"
COMPILE = ROOT / "tests" / "scripts" / "sparsecore_compile.py"
SAMPLES = ROOT / "samples"
KIB = 1024


def _run(tmp_path: Path, *args: str, command: str = "run") -> tuple[int, str, dict | None]:
    report = tmp_path / f"report-{len(list(tmp_path.iterdir()))}.json"
    proc = run_cli(
        [command, "--format", "json", "--output",
         str(report), *args], timeout=600, cwd=ROOT)
    data = json.loads(report.read_text()) if report.exists() else None
    return proc.returncode, proc.stdout + proc.stderr, data


@pytest.mark.parametrize("tpu", ["v6e", "v7x", "v5p"])
def test_axis_index_answers_core_and_subcore(tmp_path, tpu):
    code, output, report = _run(tmp_path, str(MESH), "coords", "--tpu", tpu, "--races")
    assert code == ExitCode.CLEAN, output
    assert "coords: output matches" in output and report["findings"] == []


@pytest.mark.parametrize("tpu, cores", [("v5p", 4), ("v6e", 2), ("v7x", 2)])
def test_a_mesh_without_sizes_is_the_chips(tmp_path, tpu, cores):
    """VectorSubcoreMesh() without num_cores / num_subcores: every SparseCore and subcore of
    the --tpu chip, each an actor."""
    code, output, report = _run(tmp_path, str(MESH), "chip_coords", "--tpu", tpu)
    assert code == ExitCode.CLEAN, output
    assert f"chip mesh: {cores} x 16" in output and "chip_coords: output matches" in output


def test_actors_are_named_by_sparsecore_and_subcore(tmp_path):
    """Subcore s of SparseCore 0 and subcore s of SparseCore 1 write one HBM row: a race
    between two actors named by their place in the mesh."""
    code, output, report = _run(tmp_path, str(MESH), "row_race", "--tpu", "v6e", "--races")
    assert code == ExitCode.FINDINGS, output
    (finding,) = report["findings"]
    assert finding["kind"] == "race" and finding["buffer"] == "o_hbm"
    actors = sorted(re.search(r"started by (sparsecore \d subcore \d)", a["actor"]).group(1)
                    for a in finding["accesses"])
    row = finding["accesses"][0]["index_range"][0][0]
    assert actors == [f"sparsecore 0 subcore {row}", f"sparsecore 1 subcore {row}"]


def test_each_sparsecore_has_its_own_vmem_shared(tmp_path):
    """SparseCore c fills its VMEM_SHARED with c + 1 and reads it back: with one buffer
    for both (as for the cores of a TensorCore mesh) the two would race on it."""
    code, output, report = _run(tmp_path, str(MESH), "shared", "--tpu", "v6e", "--races",
                                "--dma", "random", "--schedules", "5")
    assert code == ExitCode.CLEAN, output
    assert "shared: output matches" in output and report["findings"] == []


def test_per_subcore_partial_sums_match_numpy(tmp_path):
    code, output, report = _run(tmp_path, str(MESH), "partial_sum", "--tpu", "v7x", "--races")
    assert code == ExitCode.CLEAN, output
    assert "partial_sum: output matches" in output and report["findings"] == []
    assert report["calls"][0]["kernel"] == "kernel"


def test_a_sparsecore_kernel_after_a_tensorcore_kernel(tmp_path):
    code, output, report = _run(tmp_path, str(MESH), "with_tc", "--tpu", "v6e", "--races")
    assert code == ExitCode.CLEAN, output
    assert "with_tc: output matches" in output and len(report["calls"]) == 2


def test_under_shard_map_over_two_devices(tmp_path):
    trace = tmp_path / "trace.json"
    code, output, report = _run(tmp_path, "--devices", "2", "--trace", str(trace), str(MESH),
                                "shard_map", "--tpu", "v6e", "--races")
    assert code == ExitCode.CLEAN, output
    assert "shard_map: output matches" in output and report["findings"] == []
    events = json.loads(trace.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    tracks = {(e["pid"], e["args"]["name"]) for e in events if e.get("name") == "thread_name"}
    subcores = {name for _, name in tracks if name.startswith("sparsecore")}
    assert subcores == {f"sparsecore {c} subcore {s}" for c in range(2) for s in range(4)}
    assert len({pid for pid, name in tracks if name in subcores}) == 2  # one per device


@pytest.mark.parametrize("tpu", ["v6e", "v7x", "v5p"])
def test_scalar_subcore_sample(tmp_path, tpu):
    code, output, report = _run(tmp_path, str(SAMPLES / "sc_scalar_subcore_ok.py"),
                                "--tpu", tpu, "--races")
    assert code == ExitCode.CLEAN, output
    assert "output matches" in output and report["findings"] == []


def test_a_chip_without_sparsecores_is_one_line(tmp_path):
    """The default --tpu v5e has no SparseCore: JAX's mesh constructor raises in the
    user's script; pallas-check says so in one line and exits 2 (usage)."""
    proc = subprocess.run([sys.executable, "-m", "pallas_check", "run",
                           str(SAMPLES / "sc_two_sparsecores_ok.py")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == ExitCode.USAGE, proc.stdout + proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "pallas-check: error: this script builds a SparseCore mesh (plsc.VectorSubcoreMesh"
        " / ScalarSubcoreMesh), but --tpu v5e has no SparseCores: pass --tpu v6e, v7x or v5p"]


@pytest.mark.parametrize("rows, over", [(600, {"v6e"}), (1100, {"v6e", "v7x", "v5p"})])
def test_vmem_exceeded_per_generation(tmp_path, rows, over):
    """A (rows, 128) f32 scratch in every vector subcore: 300 KiB is over v6e's 256 KiB,
    550 KiB over every chip's (v5p and v7x: 512 KiB)."""
    code, output, report = _run(tmp_path, str(MESH), "vmem", str(rows),
                                "--tpu", "v6e,v7x,v5p")
    simulated = over != {"v6e", "v7x", "v5p"}  # fits one chip: simulated on it
    # Not simulated, the outputs are the --uninit fill: the script's own check fails.
    assert code == (ExitCode.FINDINGS if simulated else ExitCode.USER_ERROR), output
    findings = report["findings"]
    assert {f["details"]["generation"] for f in findings} == over
    for f in findings:
        assert f["kind"] == "vmem-exceeded" and f["buffer"] == "big_v"
        assert f["details"]["used_bytes"] == rows * 128 * 4
        assert f["details"]["available_bytes"] == {"v6e": 256, "v7x": 512,
                                                   "v5p": 512}[f["details"]["generation"]] * KIB
        assert "over a SparseCore vector subcore's VMEM" in f["message"]
        assert f["details"]["simulated"] == simulated
    assert ("output matches" in output) == simulated


def test_compile_through_the_sparsecore_lowering(tmp_path):
    """A kernel with subcore barriers: pallas_call's TensorCore lowering cannot lower
    `barrier`; the SparseCore lowering compiles it for v6e and v7x, with its footprint in
    one subcore's VMEM."""
    code, output, report = _run(tmp_path, str(COMPILE), "barrier", "--tpu", "v6e,v7x",
                                command="compile")
    assert code == ExitCode.CLEAN, output
    (call,) = report["calls"]
    for generation, capacity in (("v6e", 256 * KIB), ("v7x", 512 * KIB)):
        entry = call["compiled"][generation]
        assert entry["status"] == "ok", entry
        assert entry["vmem_capacity_bytes"] == capacity
        assert 0 < entry["vmem_used_bytes"] < capacity


def test_a_sparsecore_compile_error_is_at_its_line(tmp_path):
    code, output, report = _run(tmp_path, str(COMPILE), "vector_carry", "--tpu", "v6e,v7x",
                                command="compile")
    assert code == ExitCode.FINDINGS, output
    findings = report["findings"]
    assert {f["details"]["generation"] for f in findings} == {"v6e", "v7x"}
    line = next(n for n, text in enumerate(COMPILE.read_text().splitlines(), 1)
                if "jax.lax.fori_loop" in text)
    for f in findings:
        assert f["kind"] == "compile-error"
        assert f["message"].endswith("Mosaic: Loop with vector carry not supported")
        assert f["frames"][0]["line"] == line


def test_compiled_sparsecore_vmem_overflow_is_the_compilers_verdict(tmp_path):
    """`--compile`: libtpu places every subcore's VMEM scratch in the SparseCore's spmem
    (4 MiB on v6e): 16 x 300 KiB does not fit (E3000); the compiler's finding replaces the
    reckoned one, and v7x compiles."""
    code, output, report = _run(tmp_path, str(MESH), "vmem", "600", "--tpu", "v6e,v7x",
                                "--compile")
    assert code == ExitCode.FINDINGS, output
    (finding,) = report["findings"]
    assert finding["kind"] == "vmem-exceeded" and finding["buffer"] == "big_v"
    assert finding["details"]["error_code"] == "E3000"
    assert finding["details"]["used_bytes"] == 16 * 600 * 128 * 4
    assert finding["details"]["available_bytes"] == 4 * 1024 * KIB
    assert "spmem" in finding["message"] and "compiler's own scratch" not in finding["message"]
    assert report["calls"][0]["compiled"]["v7x"]["status"] == "ok"


def test_an_mpmd_kernel_is_refused_in_one_line(tmp_path):
    """pl.kernel over a vector and a scalar subcore mesh: JAX's CPU lowering of mpmd_map
    refuses several meshes; pallas-check says it does not simulate them yet (exit 4)."""
    proc = subprocess.run([sys.executable, "-m", "pallas_check", "run", str(MESH), "mpmd",
                           "--tpu", "v6e"], capture_output=True, text=True, timeout=600,
                          cwd=ROOT)
    assert proc.returncode == ExitCode.INTERNAL, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "pallas-check: error: a pl.kernel over several meshes at once (MPMD: e.g. vector and"
        " scalar subcores) is not simulated yet by pallas-check"]
