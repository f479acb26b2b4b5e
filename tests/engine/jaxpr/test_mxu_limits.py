"""What the compiler refuses in explicit MXU operations (engine/jaxpr/mxu_limits.py): before
TPU v7 all of them, on v7x the shapes, types, MXUs, registers and accumulator addresses it
does not take. Each refusal is a `compile-error` finding at the operation's line, found
before the call runs (the call is skipped: its output the never-written fill), with
libtpu's own words; the words were seen with libtpu 0.0.42, and the last test holds them
to libtpu's when it is installed.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
from pathlib import Path

import numpy as np
import pytest

from pallas_check.config import Config
from pallas_check.tpu_compile.toolchain import libtpu_missing

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "mxu_cases.py"


def _cases():
    spec = importlib.util.spec_from_file_location("mxu_cases", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CASES = _cases()
BY_NAME = {case[0]: case for case in CASES.CASES}

# The compiler's words per case (libtpu 0.0.42 for v7x), and the operation they stop at.
REFUSED = {
    "rhs_not_square": ("matmul_push_rhs",
                       "The pushed RHS must be 256x256, but got 'vector<256x128xf32>'"),
    "lhs_k_128": ("matmul_acc_lhs",
                  "The LHS contracting dimension must be 256, but got 'vector<8x128xf32>'"),
    "bf16_lhs_rows_8": ("matmul_acc_lhs",
                        "The non-contracting dimension of the LHS must be a multiple of 16"
                        " for 'bf16', but got 'vector<8x256xbf16>'"),
    "int8_operands": ("matmul_push_rhs", "'i8'"),
    "pop_128_wide": ("matmul_pop", "The RHS non-contracting dimension must be 256, but got"
                                   " 'vector<8x128xf32>'"),
    "pop_int32": ("matmul_pop", "'i32'"),
    "acc_out_of_range": ("matmul_acc_lhs", "OOB accumulator access."),
    "acc_odd_address": ("matmul_acc_lhs", "RET_CHECK failure"),
    "mxu_2": ("matmul_push_rhs", "mxu_id < target.MxusPerTensorCore() (2 < 2)"),
    "register_2": ("matmul_push_rhs", "2"),
}


def _line(operation: str) -> int:
    lines, first = inspect.getsourcelines(CASES.call)
    return next(first + k for k, text in enumerate(lines) if f"pltpu.{operation}(" in text)


@pytest.mark.parametrize("tpu", ["v5e", "v5p", "v6e"])
def test_before_v7_the_operations_are_a_compile_error(check, tpu):
    r = check(CASES.call, *BY_NAME["compiles"], config=Config(tpu=tpu))
    [finding] = r.session.findings
    assert finding.kind.value == "compile-error" and finding.skipped
    assert finding.details == {"operation": "matmul_push_rhs", "mosaic":
                               "Explicit MXU ops not supported on TPU generations < 7."}
    assert finding.frames[0].line == _line("matmul_push_rhs")
    assert f"do not lower for TPU {tpu}" in finding.message
    assert np.isnan(np.asarray(r.value)).all()  # skipped: the output is never written


def test_v7x_compiles_the_legal_case(check):
    r = check(CASES.call, *BY_NAME["compiles"], config=Config(tpu="v7x"))
    assert r.session.findings == [] and r.session.engine_error is None
    np.testing.assert_array_equal(np.asarray(r.value), np.full((8, 256), 256.0, np.float32))


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_v7x_refusals_are_the_compilers(check, name):
    r = check(CASES.call, *BY_NAME[name], config=Config(tpu="v7x"))
    [finding] = r.session.findings
    operation, mosaic = REFUSED[name]
    assert finding.kind.value == "compile-error" and finding.skipped
    assert finding.details == {"operation": operation, "mosaic": mosaic}
    assert finding.frames[0].line == _line(operation)


@pytest.mark.skipif(libtpu_missing() is not None, reason="libtpu is not installed")
def test_the_refusals_are_libtpus(cli, tmp_path):
    """`pallas-check compile --tpu v7x` (libtpu) refuses exactly the calls the simulation
    refuses, in words that hold ours."""
    report = tmp_path / "compile.json"
    result = cli("compile", str(SCRIPT), "--tpu", "v7x", "--format", "json",
                 "--output", str(report))
    assert result.exit_code == 1, result.output
    findings = json.loads(report.read_text())["findings"]
    said = {f["kernel"]["name"]: f["message"] for f in findings}
    assert set(said) == set(REFUSED)
    for name, (_, mosaic) in REFUSED.items():
        assert mosaic in said[name], (name, said[name])
