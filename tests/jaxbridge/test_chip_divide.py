"""The chip's reciprocal and division (jaxbridge/chip_divide.py) held to what a TPU v5e
returned in session 33: `hardware/chip/v5e/recip_sample.npz` (every 16th of the 2**21
estimates and reciprocals on a grid of [1, 2), hardware/probes/exp_verify.py),
`exp_bits_sample.npz` (quotients and reciprocals of random operands, exp_bits.py) and
`exp_bits_bf16.npz` (the reciprocal and logistic of every bfloat16 value, in float32)."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

from pallas_check.config import Config
from pallas_check.jaxbridge import chip_divide, chip_exp
from pallas_check.jaxbridge.chip_arithmetic import chip_arithmetic

CHIP = Path(__file__).resolve().parents[2] / "hardware" / "chip" / "v5e"
GRID = np.load(CHIP / "recip_sample.npz")
SAMPLE = np.load(CHIP / "exp_bits_sample.npz")
BF16 = np.load(CHIP / "exp_bits_bf16.npz")


def _same(ours: object, chip: np.ndarray) -> bool:
    ours = np.asarray(ours, np.float32)
    return bool(((ours.view(np.uint32) == chip.view(np.uint32))
                 | (np.isnan(ours) & np.isnan(chip))).all())


def _bf16_values() -> np.ndarray:
    x = (np.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32).copy()
    x[~np.isfinite(x)] = 0.0
    return x


def test_the_estimate_and_the_reciprocal_are_the_chips_on_the_grid():
    assert _same(chip_divide.estimate_bits(GRID["b"]), GRID["estimate"])
    assert _same(chip_divide.reciprocal_bits(GRID["b"]), GRID["reciprocal"])
    exact = (np.float32(1) / GRID["b"]).astype(np.float32)
    assert not _same(exact, GRID["reciprocal"])  # the model is needed


def test_random_quotients_and_reciprocals_are_the_chips():
    a, b = SAMPLE["div.a"], SAMPLE["div.b"]
    assert _same(chip_divide.reciprocal_bits(b), SAMPLE["div.one_over_b"])
    assert _same(chip_divide.divide_bits(a, b), SAMPLE["div.a_over_b"])
    assert _same(chip_divide.divide_bits(a, b), SAMPLE["div.a_times_recip"])


def test_every_bfloat16_value_and_the_special_ones():
    """Zeros and subnormals give infinities, what would be subnormal is zero, 2**126 keeps
    2**-126 (all as the chip returned them)."""
    x = _bf16_values()
    assert _same(chip_divide.reciprocal_bits(x), BF16["f32_of_bf16.recip"])
    with np.errstate(all="ignore"):
        logistic = chip_divide.reciprocal_bits(np.float32(1) + chip_exp.exp_bits(-x))
    assert _same(logistic, BF16["f32_of_bf16.logistic"])


def test_xla_cpu_divides_as_the_chip_under_chip_arithmetic():
    a, b = SAMPLE["div.a"], SAMPLE["div.b"]
    x = _bf16_values()
    with chip_arithmetic():
        quotient = jax.jit(lambda p, q: p / q)(a, b)
        reciprocal = jax.jit(lambda q: 1 / q)(x)
        logistic = jax.jit(jax.nn.sigmoid)(x)
        ints = jax.jit(lambda p, q: p // q)(np.arange(10), 3)
    assert _same(quotient, SAMPLE["div.a_over_b"])
    assert _same(reciprocal, BF16["f32_of_bf16.recip"])
    assert _same(logistic, BF16["f32_of_bf16.logistic"])
    assert (np.asarray(ints) == np.arange(10) // 3).all()
    with chip_arithmetic(False):
        assert not _same(jax.jit(lambda p, q: p / q)(a, b), SAMPLE["div.a_over_b"])


def _reciprocals(b_ref, full_ref, approx_ref, quotient_ref):
    full_ref[...] = pl.reciprocal(b_ref[...], approx=False)
    approx_ref[...] = pl.reciprocal(b_ref[...], approx=True)
    quotient_ref[...] = 3.0 / b_ref[...]


@pytest.mark.parametrize("tier", ["engine", "compiled"])
def test_a_kernels_reciprocals_are_the_chips(check, tier):
    b = GRID["b"][:8192].reshape(64, 128)
    shape = jax.ShapeDtypeStruct(b.shape, jnp.float32)
    result = check(pl.pallas_call(_reciprocals, out_shape=[shape] * 3), b,
                   config=Config(chip_arithmetic=True, chip_functions=True, tier=tier))
    full, approx, quotient = (np.asarray(v) for v in result.value)
    assert _same(full.reshape(-1), GRID["reciprocal"][:8192])
    assert _same(approx.reshape(-1), GRID["estimate"][:8192])
    assert _same(quotient.reshape(-1), chip_divide.divide_bits(np.float32(3), b).reshape(-1))
