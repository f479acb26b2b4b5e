"""The nested-pipeline matmul family (samples/nested_pipeline_ok.py: a pallas_call over HBM
refs running pltpu.emit_pipeline, outer grid parallel x arbitrary, and a custom_vjp
backward of the same kernel) runs clean under pallas-check with the values of jax.numpy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _cli_worker import run_cli

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "samples" / "nested_pipeline_ok.py"


@pytest.mark.parametrize("dma", ["on_wait", "eager"])
def test_forward_and_gradient_are_clean_and_right(dma):
    result = run_cli(
        ["run", "--races", "--dma", dma,
         "--format", "json", str(SAMPLE)],
        cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["findings"] == []
    # forward, then the backward's two calls (dx = g w^T, dw = x^T g)
    assert [c["kernel"] for c in report["calls"]] == ["nested_matmul_kernel"] * 3
    # the sample's own check against jax.numpy (value and both gradients)
    assert "nested_pipeline_ok: output matches" in result.stderr
