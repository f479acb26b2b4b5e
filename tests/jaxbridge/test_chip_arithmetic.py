"""Float32 products as a TPU v5e's MXU computes them, against what the chip returned.

hardware/chip/v5e/matmul.npz holds the operands of hardware/probes/numerics.py's products
(x's first 16 rows, y) and the chip's results for those rows: Mosaic's (`kernel.*`) and
XLA:TPU's (`xla.*`), per precision. Under `chip_arithmetic` a product on the CPU must land
within the chip's accumulation-order noise of the chip's result (1e-4 on results of
magnitude about 50), where the exact product is 0.05 or more away.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl

from pallas_check.jaxbridge.chip_arithmetic import chip_arithmetic, rounds_operand

CHIP = np.load(Path(__file__).resolve().parents[2] / "hardware" / "chip" / "v5e" / "matmul.npz")
NOISE = 1e-4


def _kernel_dot(precision):
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = jnp.dot(x_ref[...], y_ref[...], precision=precision)
    return lambda x, y: pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((x.shape[0], y.shape[1]), jnp.float32),
        interpret=True)(x, y)


@pytest.mark.parametrize("side", ["xla", "kernel"])
@pytest.mark.parametrize("name,precision", [("none", None), ("default", lax.Precision.DEFAULT),
                                            ("highest", lax.Precision.HIGHEST)])
def test_a_product_rounds_as_the_chip_did(side, name, precision):
    x, y, chip = CHIP["x"], CHIP["y"], CHIP[f"{side}.f32.{name}"]
    fn = (jax.jit(lambda a, b: jnp.dot(a, b, precision=precision)) if side == "xla"
          else jax.jit(_kernel_dot(precision)))
    with chip_arithmetic():
        ours = np.asarray(fn(x, y))
    exact = np.asarray(x, np.float64) @ np.asarray(y, np.float64)
    assert np.abs(ours - chip).max() <= NOISE
    if name != "highest":
        assert np.abs(exact - chip).max() > 0.05  # the rounding is what the test sees


def test_outside_chip_arithmetic_a_product_is_exact_float32():
    x, y = CHIP["x"], CHIP["y"]
    ours = np.asarray(jax.jit(lambda a, b: a @ b)(x, y))
    exact = np.asarray(x, np.float64) @ np.asarray(y, np.float64)
    assert np.abs(ours - exact).max() <= NOISE
    assert np.abs(ours - CHIP["xla.f32.none"]).max() > 0.05


def test_which_operands_round():
    assert rounds_operand(None, 0) and rounds_operand(None, 1)
    assert rounds_operand((lax.Precision.DEFAULT, lax.Precision.HIGHEST), 0)
    assert not rounds_operand((lax.Precision.DEFAULT, lax.Precision.HIGHEST), 1)
    assert not rounds_operand((lax.Precision.HIGHEST, lax.Precision.HIGHEST), 0)
    assert not rounds_operand((lax.Precision.HIGH, lax.Precision.HIGH), 0)
    assert rounds_operand(lax.DotAlgorithmPreset.BF16_BF16_F32, 0)
    assert not rounds_operand(lax.DotAlgorithmPreset.F32_F32_F32, 0)


def test_integer_and_bfloat16_products_are_left_exact():
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (8, 256)).astype(np.int8)
    b = rng.integers(-128, 128, (256, 128)).astype(np.int8)
    with chip_arithmetic():
        got = np.asarray(jnp.dot(a, b, preferred_element_type=jnp.int32))
        xb = jnp.asarray(CHIP["x"], jnp.bfloat16)
        yb = jnp.asarray(CHIP["y"], jnp.bfloat16)
        bf = np.asarray(jnp.dot(xb, yb, preferred_element_type=jnp.float32))
    assert (got == a.astype(np.int64) @ b.astype(np.int64)).all()
    want = np.asarray(xb, np.float64) @ np.asarray(yb, np.float64)
    assert np.abs(bf - want).max() <= NOISE


def test_one_jitted_function_follows_the_arithmetic_it_is_run_in():
    """A function compiled in one arithmetic is not run in the other: JAX's caches are
    emptied when the mode changes after a product was lowered in the mode left."""
    x, y = CHIP["x"], CHIP["y"]
    product = jax.jit(lambda a, b: a @ b)
    exact = np.asarray(x, np.float64) @ np.asarray(y, np.float64)
    with chip_arithmetic():
        first = np.asarray(product(x, y))
    between = np.asarray(product(x, y))
    with chip_arithmetic():
        again = np.asarray(product(x, y))
        with chip_arithmetic(False):
            inner = np.asarray(product(x, y))
    for rounded in (first, again):
        assert np.abs(rounded - CHIP["xla.f32.none"]).max() <= NOISE
    for plain in (between, inner):
        assert np.abs(plain - exact).max() <= NOISE
