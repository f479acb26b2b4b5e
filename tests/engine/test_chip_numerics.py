"""Kernel arithmetic held to what a TPU v5e computed (hardware/chip/v5e/, extracted from
session 28's probes, hardware/probes/numerics.py): the chip's transcendental functions are
approximations (exp up to 95 ulp, tanh and log1p up to about 4e-5 of their largest value);
the simulation computes them with XLA:CPU. `diff` and `replay` compare against a chip
within the noise measured there (findings/output_diff.py `_CHIP_TOLERANCES`): every
function the chip computed must agree with ours within it, and the default float32
tolerance alone must not (otherwise the chip tolerance would be needless).
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl

from pallas_check.config import Config
from pallas_check.findings.output_diff import compare

CHIP = Path(__file__).resolve().parents[2] / "hardware" / "chip" / "v5e"
UNARY = np.load(CHIP / "unary.npz")
FUNCTIONS = {"exp": jnp.exp, "log": jnp.log, "tanh": jnp.tanh, "logistic": jax.nn.sigmoid,
             "sin": jnp.sin, "cos": jnp.cos, "sqrt": jnp.sqrt, "rsqrt": lax.rsqrt,
             "recip": lambda v: 1.0 / v, "recip_approx": lambda v: pl.reciprocal(v, approx=True),
             "erf": jax.scipy.special.erf, "log1p": jnp.log1p, "exp2": jnp.exp2,
             "pow2_5": lambda v: v ** 2.5, "erf_inv": jax.scipy.special.erfinv}


def _kernel(fn):
    def kernel(x_ref, o_ref):
        o_ref[...] = fn(x_ref[...])
    return lambda x: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_a_transcendental_agrees_with_the_chip_within_its_noise(check, name):
    x = UNARY[f"in.{name}"].reshape(8, 128)
    chip = UNARY[f"kernel.unary.{name}"].reshape(8, 128)
    result = check(_kernel(FUNCTIONS[name]), x, config=Config(chip_arithmetic=True))
    assert result.findings == []
    ours = np.asarray(result.value)
    assert compare(ours, chip, chip=True).mismatches == 0


def test_the_chip_tolerance_is_needed():
    """tanh, log1p and the approximate reciprocal differ from an exact float32 result beyond
    the plain float32 tolerance on the chip (exp, at 6.6e-6 relative, stays within it)."""
    needed = []
    for name in ("exp", "tanh", "log1p", "recip_approx"):
        x = UNARY[f"in.{name}"].astype(np.float64)
        exact = {"exp": np.exp, "tanh": np.tanh, "log1p": np.log1p,
                 "recip_approx": lambda v: 1.0 / v}[name](x).astype(np.float32)
        if compare(exact, UNARY[f"kernel.unary.{name}"]).mismatches:
            needed.append(name)
    assert needed == ["tanh", "log1p", "recip_approx"]
