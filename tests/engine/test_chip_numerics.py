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


# The shipped flash attention's single-step kernel (`p /= l; dot(p, v)`) on the operands of
# the kernel repository's call the chip computed (hardware/device_call7.sh, session 32):
# hardware/probes/flash_inputs.npz. XLA:CPU dropped the bfloat16 rounding of `p` there
# (a convert pair, removed under excess precision), leaving ours 7.3e-3 off the chip.
FLASH = np.load(Path(__file__).resolve().parents[2] / "hardware" / "probes" / "flash_inputs.npz")


@pytest.mark.parametrize("tier", ["engine", "compiled"])
def test_the_shipped_flash_attention_agrees_with_the_chip(check, tier):
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    def attention(q, k, v):
        return fa.flash_attention(q, k, v, causal=False, sm_scale=1.0)

    result = check(attention, FLASH["q"], FLASH["k"], FLASH["v"],
                   config=Config(chip_arithmetic=True, tier=tier))
    ours, chip = np.asarray(result.value), FLASH["chip_out"]
    assert result.findings == []
    assert compare(ours, chip, chip=True).mismatches == 0
    exact = check(attention, FLASH["q"], FLASH["k"], FLASH["v"],
                  config=Config(chip_arithmetic=False, tier=tier))
    assert compare(np.asarray(exact.value), chip, chip=True).mismatches > 0  # seen


BF16 = np.load(CHIP / "bf16_rounding.npz")  # hardware/probes/bf16_rounding.py, session 32


def _round_then_dot(x_ref, y_ref, o_ref):
    p = (x_ref[...] / 3.0).astype(jnp.bfloat16).astype(jnp.float32)
    o_ref[...] = jnp.dot(p, y_ref[...], precision=lax.Precision.HIGHEST)


def _bf16_chain(a_ref, b_ref, c_ref, fma_ref, mul_ref):
    fma_ref[...] = (a_ref[...] * b_ref[...] + c_ref[...]).astype(jnp.float32)
    mul_ref[...] = (a_ref[...] * b_ref[...]).astype(jnp.float32)


@pytest.mark.parametrize("tier", ["engine", "compiled"])
def test_a_kernels_own_roundings_are_kept_as_on_the_chip(check, tier):
    """The v5e rounds each bfloat16 result as written (`a * b + c`: 1891 of 8192 results
    differ from rounding once at the end) and keeps an `astype(bfloat16).astype(float32)`
    pair; XLA:CPU, allowed excess precision, did neither. In exact arithmetic: bit for bit
    on the chain, within accumulation noise on the product."""
    config = Config(chip_arithmetic=False, tier=tier)
    a, b, c = (jnp.asarray(BF16[name], jnp.bfloat16) for name in "abc")
    shape = jax.ShapeDtypeStruct(a.shape, jnp.float32)
    chain = check(pl.pallas_call(_bf16_chain, out_shape=[shape, shape]), a, b, c,
                  config=config)
    assert (np.asarray(chain.value[0]) == BF16["chain.fma"]).all()
    assert (np.asarray(chain.value[1]) == BF16["chain.mul"]).all()
    x, y = BF16["x"], BF16["y"]
    got = check(pl.pallas_call(_round_then_dot,
                               out_shape=jax.ShapeDtypeStruct((128, 128), jnp.float32)),
                x, y, config=config)
    assert compare(np.asarray(got.value), BF16["cast_pair_dot"], chip=True).mismatches == 0


# The flash attention elements still apart from the chip (hardware/README.md, session 32):
# call 30 of the kernel repository's recording (sm_scale 0.125), and the chip's own `p / l`
# for it (hardware/probes/flash_midpoints.py).
C30 = np.load(Path(__file__).resolve().parents[2] / "hardware" / "probes"
              / "flash_inputs_c30.npz")
MIDPOINTS = np.load(CHIP / "flash_midpoints.npz")


def _normalized(q_ref, k_ref, p_ref):
    s = lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                        preferred_element_type=jnp.float32) * 0.125
    p = jnp.exp(s - jnp.max(s, axis=1)[:, None])
    p_ref[...] = p / jnp.sum(p, axis=1)[:, None]


def _bf16(x):
    return np.asarray(jnp.asarray(x, jnp.float32).astype(jnp.bfloat16), np.float64)


@pytest.mark.parametrize("tier", ["engine", "compiled"])
def test_flash_attention_is_the_chips_to_the_accumulation_order(check, tier):
    """With the chip's own exp (jaxbridge/chip_exp.py) the shipped flash attention on call
    30's operands gives the chip's output within float32 accumulation noise (1.8e-7 on
    values up to 2.3) -- no bfloat16 MXU operand rounds the other way. Session 32 left 147
    elements of this call beyond the chip tolerance: XLA:CPU's exp, at bfloat16 midpoints of
    `p / l` (hardware/chip/v5e/flash_midpoints.npz holds the chip's `p / l`)."""
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    config = Config(chip_arithmetic=True, chip_functions=True, tier=tier)
    q, k, v, chip = C30["q"], C30["k"], C30["v"], C30["chip_out"]

    def attention(*a):
        return fa.flash_attention(*a, causal=False, sm_scale=0.125)

    ours = np.asarray(check(attention, q, k, v, config=config).value)
    assert np.abs(ours - chip).max() <= 4e-7
    # without the chip's functions (`run`'s default): XLA:CPU's exp, a few bfloat16 flips
    plain = np.asarray(check(attention, q, k, v,
                             config=Config(chip_arithmetic=True, tier=tier)).value)
    assert compare(plain, chip, chip=True).mismatches > 0
    normalized = pl.pallas_call(_normalized,
                                out_shape=jax.ShapeDtypeStruct((128, 128), jnp.float32))
    for b in range(q.shape[0]):
        chip_p = MIDPOINTS[f"p_over_l.{b}"]
        our_p = np.asarray(check(normalized, q[b, 0], k[b, 0], config=config).value)
        assert np.array_equal(_bf16(chip_p), _bf16(our_p))  # the MXU's operands: the chip's
