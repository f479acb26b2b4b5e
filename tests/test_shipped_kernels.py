"""Every kernel JAX ships in jax/experimental/pallas/ops/tpu/ runs under `pallas-check run`
with zero findings and outputs equal to a jax.numpy reference (each case script asserts
its outputs and prints "OK <name>"; see tests/shipped_kernels/)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CASES = Path(__file__).parent / "shipped_kernels"

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


@pytest.mark.parametrize("case,options", IN_PROCESS, ids=[c for c, _ in IN_PROCESS])
def test_shipped_kernel_is_clean_and_correct(cli, case, options):
    result = cli("run", *options, str(CASES / f"case_{case}.py"))
    assert result.report is not None, result.output
    assert result.report["user_error"] is None, result.report["user_traceback"]
    assert result.report["internal_error"] is None, result.report["internal_error"]
    assert result.findings == [], result.findings
    assert result.exit_code == 0
    assert f"OK {case}" in result.output
    assert result.report["calls"], "no pallas_call was intercepted"


@pytest.mark.parametrize("dma", ["on_wait", "eager", "random"])
def test_shipped_all_gather_on_four_devices(tmp_path, dma):
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pallas_check", "run", "--devices", "4", "--races", "--dma", dma,
         "--format", "json", "--output", str(report), str(CASES / "case_all_gather.py")],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK all_gather" in proc.stdout
    data = json.loads(report.read_text())
    assert data["findings"] == []
    assert data["calls"][0]["kernel"] == "ag_kernel"
