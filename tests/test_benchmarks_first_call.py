"""benchmarks/first_call.py (issue 55.3): its worker, in a fresh process as the benchmark
runs it, checks each kernel's output against its jax.numpy reference (a wrong kernel or a
wrong simulation stops the benchmark) and says which tier ran the call."""

from __future__ import annotations

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import first_call  # noqa: E402


def test_the_worker_times_a_checked_first_call_and_checks_its_output(tmp_path):
    found = first_call.run_worker("prefetch", "pc-nochip", "call", str(tmp_path / "cache"),
                                  str(tmp_path / "pycache"))
    assert found["findings"] == 0 and found["tiers"] == ["engine"]
    assert 0 < found["first"] <= found["block"]


def test_the_worker_lowers_under_jax_interpreter_without_calling(tmp_path):
    found = first_call.run_worker("matmul", "hlo", "lower", "off", str(tmp_path / "pycache"))
    assert set(found) == {"import_and_inputs", "first"}
