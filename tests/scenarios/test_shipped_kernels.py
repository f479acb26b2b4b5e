"""Every kernel JAX ships in jax/experimental/pallas/ops/tpu/ runs under `pallas-check run`
with zero findings and outputs equal to a jax.numpy reference (each case script asserts
its outputs and prints "OK <name>"; see tests/shipped_kernels/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _cli_worker import CliRun, run_cli

CASES = Path(__file__).parent.parent / "shipped_kernels"

# (case, extra options). Paged attention's megacore modes split a grid axis over two
# TensorCores, so they need --cores 2 (on one core they rightly deadlock).
IN_PROCESS = [
    ("example_kernel", ["--races"]),
    ("matmul", ["--races", "--cores", "2"]),
    ("flash_attention", []),
    ("paged_attention", ["--cores", "2", "--races"]),
    ("ragged_paged_attention", []),
    ("megablox_gmm", []),
    ("splash_attention", []),
    ("random", []),
]


# The cases hold the simulation to float64-accurate (`HIGHEST`) references at tight
# tolerances: in exact arithmetic. A TPU rounds these kernels' default-precision products
# (so would `run` by default: --chip-arithmetic), and on the chip they would miss these
# tolerances; the chip's rounding is held to the chip's own results elsewhere
# (tests/jaxbridge/test_chip_arithmetic.py, tests/kernel_repo).
EXACT = "--exact-arithmetic"


@pytest.mark.parametrize("case,options", IN_PROCESS, ids=[c for c, _ in IN_PROCESS])
def test_shipped_kernel_is_clean_and_correct(cli, case, options):
    result = cli("run", EXACT, *options, str(CASES / f"case_{case}.py"))
    assert result.report is not None, result.output
    assert result.report["user_error"] is None, result.report["user_traceback"]
    assert result.report["internal_error"] is None, result.report["internal_error"]
    assert result.findings == [], result.findings
    assert result.exit_code == 0
    assert f"OK {case}" in result.output
    assert result.report["calls"], "no pallas_call was intercepted"


def _run_all_gather(tmp_path, *options: str) -> tuple[CliRun, dict]:
    report = tmp_path / "report.json"
    proc = run_cli(
        ["run", "--devices", "4", "--races", *options,
         "--format", "json", "--output", str(report), str(CASES / "case_all_gather.py")],
        timeout=600)
    return proc, json.loads(report.read_text())


def _ring_races(data: dict) -> list[dict]:
    """Races between one DMA's landing in a slot and another DMA forwarding that slot."""
    races = []
    for finding in data["findings"]:
        if finding["kind"] != "race":
            continue
        ops = [a["operation"] for a in finding["accesses"]]
        lines = {a["frames"][0]["line"] for a in finding["accesses"]}
        code = {a["frames"][0]["code"] for a in finding["accesses"]}
        files = {Path(a["frames"][0]["file"]).name for a in finding["accesses"]}
        if (finding["buffer"] == "o_ref" and sorted(ops) == ["DMA read", "DMA write"]
                and files == {"all_gather.py"} and len(lines) == 1
                and code <= {"right_dma = pltpu.async_remote_copy(",
                             "left_dma = pltpu.async_remote_copy("}):
            races.append(finding)
    return races


def test_shipped_all_gather_races_when_chunks_land_out_of_order(tmp_path):
    """The shipped all_gather relies on the chunks of one ring direction landing in the
    order they were sent on one receive semaphore. On a TPU they land in any order (a
    neighbour that has *sent* chunk s sends chunk s+1 while s is in flight), so a device's
    wait can be satisfied by chunk s+1 while chunk s, which it forwards next, has not
    arrived. `on_wait` lands the newest DMA first: the race is reported with both DMAs
    (the landing write and the forwarding read, same line of all_gather.py), and the
    forwarded half-chunk is wrong, so the case's own output check fails (JAX's
    interpreter returns NaN there in the same mode)."""
    proc, data = _run_all_gather(tmp_path, "--dma", "on_wait")
    assert _ring_races(data), data["findings"]
    assert proc.returncode == 3, proc.stdout + proc.stderr  # the case's check fails
    assert data["calls"][0]["kernel"] == "ag_kernel"


def test_shipped_all_gather_race_is_found_by_random_schedules(tmp_path):
    proc, data = _run_all_gather(tmp_path, "--dma", "random", "--schedules", "20")
    assert _ring_races(data), data["findings"]
    assert proc.returncode in (1, 3)  # some landing orders happen to give the right output


def test_shipped_all_gather_is_clean_when_dmas_land_at_their_start(tmp_path):
    """`eager` lands every DMA when it starts, so chunks land in the order they were
    sent: the kernel's assumption holds and nothing is reported (README, memory model)."""
    proc, data = _run_all_gather(tmp_path, "--dma", "eager")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK all_gather" in proc.stdout
    assert data["findings"] == []


# The shipped kernels the compiled tier runs whole: each call compiled from its first,
# outputs checked against the case's own reference, no finding (as on the engine, above).
COMPILED = ["example_kernel", "flash_attention", "random"]


@pytest.mark.parametrize("case", COMPILED)
def test_shipped_kernel_runs_compiled_clean_and_correct(cli, case):
    result = cli("run", EXACT, "--tier", "compiled", str(CASES / f"case_{case}.py"))
    assert result.report is not None, result.output
    assert result.report["user_error"] is None, result.report["user_traceback"]
    assert f"OK {case}" in result.output
    assert result.findings == [] and result.exit_code == 0
    assert [c["tier"] for c in result.report["calls"]] == ["compiled"] * len(
        result.report["calls"]) != []
