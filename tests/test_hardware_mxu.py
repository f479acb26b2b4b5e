"""The MXU's order of addition found in session 33 (hardware/mxu_model.py, not yet used by
the simulation) held to the chip's sums it was found from (hardware/chip/v5e/mxu_order.npz,
hardware/probes/mxu_order.py): the evidence for the next step stays checkable without a
TPU."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
CHIP = np.load(ROOT / "hardware" / "chip" / "v5e" / "mxu_order.npz")
_spec = importlib.util.spec_from_file_location("mxu_model", ROOT / "hardware" / "mxu_model.py")
assert _spec is not None and _spec.loader is not None
mxu_model = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mxu_model)


@pytest.mark.parametrize("k", [32, 64, 128, 256, 512])
def test_the_order_reproduces_every_sum_of_normal_operands(k):
    for seed in range(3):
        x, y = CHIP[f"k{k}.random.{seed}.x"], CHIP[f"k{k}.random.{seed}.y"]
        ours = mxu_model.product(x, y)
        for form in ("dot", "qkT", "dot.f32", "qkT.f32"):
            assert np.array_equal(ours, CHIP[f"k{k}.random.{seed}.{form}"]), form
        exact = (x.astype(np.float64) @ y.astype(np.float64)).astype(np.float32)
        assert not np.array_equal(exact, CHIP[f"k{k}.random.{seed}.dot"])  # order matters


def test_wide_operands_are_the_known_gap():
    """Operands spread over e^+-6: most sums, not all (what is left to find)."""
    x, y = CHIP["k128.random_wide.x"], CHIP["k128.random_wide.y"]
    agree = (mxu_model.product(x, y) == CHIP["k128.random_wide.dot"]).mean()
    assert 0.9 < agree < 1.0
