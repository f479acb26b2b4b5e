"""Reports: the JSON schema, its determinism, the table, and merged findings."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pallas_check.config.exitcodes import ExitCode
from pallas_check.report.json import SCHEMA, SCHEMA_VERSION

ROOT = Path(__file__).resolve().parents[2]
GRID = 8

# Two kernels: one reads past its block at every grid step (one finding, counted GRID
# times), one leaves half of its output unwritten.
SCRIPT = f"""\
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def shifted_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[pl.ds(4 + 0 * pl.program_id(0), 8), :]  # OOB


def half_kernel(x_ref, o_ref):
    o_ref[:4, :] = x_ref[:4, :]


def call(kernel, x):
    return pl.pallas_call(
        kernel, grid=(x.shape[0] // 8,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


x = jnp.arange({GRID} * 8 * 128, dtype=jnp.float32).reshape({GRID} * 8, 128)
jax.block_until_ready(call(shifted_kernel, x))
jax.block_until_ready(jax.jit(call, static_argnums=0)(half_kernel, x))
"""

FINDING_FIELDS = {"kind", "message", "kernel", "buffer", "memory_space", "index_range",
                  "frames", "grid_point", "count", "call_index", "accesses"}


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "two_kernels.py"
    path.write_text(SCRIPT)
    return path


def oob_line(path: Path) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if "# OOB" in line)


def test_json_report_fields(cli, script):
    result = cli("run", "--dma", "eager", "--no-races", str(script))
    assert result.exit_code == ExitCode.FINDINGS
    report = result.report
    for field in ("schema", "schema_version", "tool", "script", "config", "exit_code",
                  "partial", "user_error", "user_traceback", "internal_error", "calls",
                  "summary", "findings"):
        assert field in report, field
    assert report["schema"] == SCHEMA and report["schema_version"] == SCHEMA_VERSION
    assert report["tool"]["name"] == "pallas-check" and report["tool"]["version"]
    assert report["script"] == str(script)
    assert report["config"]["dma_mode"] == "eager"
    assert report["exit_code"] == ExitCode.FINDINGS and report["partial"] is False
    assert report["user_error"] is None and report["internal_error"] is None

    calls = report["calls"]
    assert [c["kernel"] for c in calls] == ["shifted_kernel", "half_kernel"]
    assert [c["index"] for c in calls] == [0, 1]
    assert calls[0]["grid"] == [GRID] and calls[0]["file"] == str(script)
    assert all(set(c) == {"index", "kernel", "file", "line", "grid", "findings", "call_site",
                          "failed", "interrupted", "progress", "compiled", "races",
                          "unused_memory", "tier", "reason"}
               for c in calls)
    # The note of memory never touched: half_kernel's output block, half written.
    assert [c["unused_memory"] for c in calls] == [[], [
        {"buffer": "o_ref", "memory_space": "VMEM", "bytes": 2048, "of_bytes": 4096,
         "ranges": [[[4, 8], [0, 128]]]}]]
    assert all(c["compiled"] == {} for c in calls)  # no --compile: nothing compiled
    assert all(c["races"] is None for c in calls)  # --no-races: no race checking
    assert all(not c["interrupted"] and c["progress"] is None for c in calls)  # finished
    assert not any(c["failed"] for c in calls)
    assert all(c["call_site"]["line"] > 0 and c["call_site"]["file"] for c in calls)

    # Which tier ran each call, and the calls per tier (both keys always).
    assert all(c["tier"] in ("engine", "compiled") and isinstance(c["reason"], str)
               for c in calls)
    tiers = report["summary"].pop("tiers")
    assert tiers == {tier: sum(c["tier"] == tier for c in calls)
                     for tier in ("engine", "compiled")}
    assert sum(tiers.values()) == len(calls)
    assert report["summary"] == {"findings": 2,
                                 "by_kind": {"out-of-bounds": 1, "unwritten-output": 1},
                                 "suppressed": 0, "suppressed_by": {}}
    oob, unwritten = report["findings"]
    for finding in report["findings"]:
        assert FINDING_FIELDS <= set(finding)
    assert oob["kind"] == "out-of-bounds"
    assert oob["kernel"]["name"] == "shifted_kernel"
    assert oob["buffer"] == "x_ref" and oob["memory_space"] == "VMEM"
    assert oob["index_range"] == [[4, 12], [0, 128]]
    assert oob["frames"][0]["file"] == str(script)
    assert oob["frames"][0]["line"] == oob_line(script)
    assert oob["frames"][0]["function"] == "shifted_kernel"
    assert "x_ref[pl.ds(4" in oob["frames"][0]["code"]
    assert oob["grid_point"] == [0]  # the first grid step that showed it
    assert oob["count"] == GRID  # ... and it was seen at every step, merged into one
    assert unwritten["kind"] == "unwritten-output" and unwritten["buffer"] == "o_ref"
    assert unwritten["call_index"] == 1 and unwritten["count"] == 1


def _run_json(script: Path, cwd: Path, hash_seed: str) -> bytes:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONHASHSEED=hash_seed)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-m", "pallas_check", "run", "--format", "json",
                           str(script)], cwd=cwd, env=env, capture_output=True, timeout=120)
    assert proc.returncode == ExitCode.FINDINGS, proc.stderr.decode()
    return proc.stdout


def test_json_report_is_byte_identical_across_runs(script, tmp_path):
    """No timestamps, durations, addresses or hash-order in the report."""
    first = _run_json(script, tmp_path, "1")
    second = _run_json(script, tmp_path, "2")
    assert first == second
    text = first.decode()
    assert "seconds" not in text and "0x" not in text


def test_table_report_shows_kind_buffer_location_and_source(cli, script):
    result = cli("run", str(script), json_report=False)
    assert result.exit_code == ExitCode.FINDINGS
    out = result.output
    assert "Out-of-bounds accesses (1)" in out
    assert "Output elements never written (1)" in out
    assert "x_ref[4:12, 0:128]" in out and "o_ref" in out
    assert f"{script}:{oob_line(script)}" in out
    # The user's source line, whole and on one line.
    assert "o_ref[...] = x_ref[pl.ds(4 + 0 * pl.program_id(0), 8), :]  # OOB" in out
    assert f"×{GRID}" in out  # the merged finding's count
    assert "shifted_kernel" in out and "half_kernel" in out
    assert out.rstrip().splitlines()[-1] == "pallas-check: 2 findings in 2 pallas_calls"


def test_table_report_of_a_failed_script(cli, tmp_path):
    path = tmp_path / "fails.py"
    path.write_text(textwrap.dedent("""\
        x = 1
        raise RuntimeError("user bug")
    """))
    result = cli("run", str(path), json_report=False)
    assert result.exit_code == ExitCode.USER_ERROR
    assert "The script failed: RuntimeError: user bug" in result.output
    assert f'File "{path}", line 2, in <module>' in result.output
    assert result.output.rstrip().endswith(
        "pallas-check: no pallas_call was checked: the script made none (or its calls never ran)")
