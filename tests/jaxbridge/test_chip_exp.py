"""The chip's exp2 and exp (jaxbridge/chip_exp.py) held to what a TPU v5e returned.

`hardware/chip/v5e/exp_bits_sample.npz`: a sample of session 33's recording
(hardware/probes/exp_bits.py; 7.7 million values, every one reproduced by the model -- the
full recording is remade by hardware/device_call9.sh): exp2 on the fraction's grid in
[0, 1) and (-1, 0], shifted by whole numbers, and over the float32 range; exp over [-88, 88]
and (-1, 0]. `exp_bits_bf16.npz`: every bfloat16 bit pattern through the chip's exp and
exp2, in bfloat16 and in float32.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from pallas_check.jaxbridge import chip_exp
from pallas_check.jaxbridge.chip_arithmetic import chip_arithmetic

CHIP = Path(__file__).resolve().parents[2] / "hardware" / "chip" / "v5e"
SAMPLE = np.load(CHIP / "exp_bits_sample.npz")
BF16 = np.load(CHIP / "exp_bits_bf16.npz")
MODEL = {"exp": chip_exp.exp_bits, "exp2": chip_exp.exp2_bits}
JNP = {"exp": jnp.exp, "exp2": jnp.exp2}


def _bits(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).view(np.uint32)


def _bf16_inputs() -> np.ndarray:
    """Every bfloat16 bit pattern as the probe sent it (inf and NaN as 0)."""
    x = (np.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32).copy()
    x[~np.isfinite(x)] = 0.0
    return x


@pytest.mark.parametrize("name", ["exp", "exp2"])
def test_the_model_is_the_chip_bit_for_bit(name):
    x, chip = SAMPLE[f"{name}.x"], SAMPLE[f"{name}.chip"]
    assert x.size > 90_000
    assert np.array_equal(_bits(MODEL[name](x)), _bits(chip))


@pytest.mark.parametrize("name", ["exp", "exp2"])
def test_bfloat16_is_the_float32_function_rounded(name):
    x = _bf16_inputs()
    ours = MODEL[name](x)
    assert np.array_equal(_bits(ours), _bits(BF16[f"f32_of_bf16.{name}"]))
    assert np.array_equal(ours.astype(ml_dtypes.bfloat16).view(np.uint16), BF16[f"bf16.{name}"])


def test_correct_rounding_is_not_the_chip():
    """The recording tells the chip's function from a correctly rounded one (the model is
    needed): most sampled values differ from float64's exp2 rounded, by up to 60 ulps."""
    x, chip = SAMPLE["exp2.x"], SAMPLE["exp2.chip"]
    exact = np.exp2(x.astype(np.float64)).astype(np.float32)
    ulps = np.abs(_bits(exact).astype(np.int64) - _bits(chip).astype(np.int64))
    assert (ulps > 0).mean() > 0.9 and 40 <= ulps.max() <= 64


@pytest.mark.parametrize("name", ["exp", "exp2"])
@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16])
def test_xla_cpu_computes_the_chips_function_under_chip_arithmetic(name, dtype):
    x = SAMPLE[f"{name}.x"]
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 127.9, 128.0,
                        -126.0, -126.5, -149.0, 88.7, -87.4, 300.0, -300.0], np.float32)
    x = np.concatenate([x, special]).astype(dtype)
    with chip_arithmetic():
        ours = np.asarray(jax.jit(JNP[name])(x))
    expected = MODEL[name](np.asarray(x, np.float32)).astype(dtype)
    assert np.array_equal(np.asarray(ours, np.float32), np.asarray(expected, np.float32),
                          equal_nan=True)
    with chip_arithmetic(False):
        exact = np.asarray(jax.jit(JNP[name])(x))
    assert not np.array_equal(np.asarray(exact, np.float32), np.asarray(expected, np.float32),
                              equal_nan=True)


def test_special_values():
    """NaN stays NaN; overflow is infinite; what would be subnormal is zero (the chip
    flushes: exp_wide's 3995 arguments below -126 all gave 0)."""
    x = np.array([np.nan, np.inf, -np.inf, 128.0, -126.0, -126.01, -0.0], np.float32)
    got = chip_exp.exp2_bits(x)
    assert np.isnan(got[0]) and got[1] == np.inf and got[2] == 0.0 and got[3] == np.inf
    assert got[4] == np.float32(2.0 ** -126) and got[5] == 0.0 and got[6] == 1.0
    below = SAMPLE["exp.x"] * chip_exp.LOG2E < -126
    assert below.any() and (SAMPLE["exp.chip"][below] == 0).all()
