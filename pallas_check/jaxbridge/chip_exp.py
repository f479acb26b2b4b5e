"""A TPU v5e's float32 `exp2` and `exp`, bit for bit.

Why: a v5e's `exp` is not the correctly rounded one (up to 64 ulps off; XLA:CPU's is within
one), and where a kernel rounds its result to bfloat16 -- flash attention's `p` before the
MXU -- a value near a rounding midpoint goes the other way: the last elements by which the
simulation of JAX's shipped flash attention differed from the chip (session 32). With the
chip's own function the simulation computes what the chip computes.

What the chip does (found from 7.7 million recorded values, hardware/probes/exp_bits.py,
hardware/README.md "exp bit for bit"; a Pallas kernel and XLA:TPU alike):

- `exp(x)` is `exp2(x * log2(e))`, the product rounded to float32 first;
- `exp2(x)` takes x in fixed point with 23 fractional bits, truncated toward zero, splits it
  into the integer part n (floor) and the fraction, and looks the fraction up in 16
  segments: for segment j and the fraction's remaining 19 bits u (h: u's top 11 bits), the
  mantissa is `C0[j] + floor((A[j] * u + floor(B[j] * h * h / 2**10)) / 2**10)` in units of
  2**-23 above 1, never below 1; the result is that mantissa times 2**n, zero where n is
  below -126 (no subnormal results) and infinite from n = 128 up. A NaN stays a NaN.
- a bfloat16 `exp`/`exp2` is the float32 one rounded to bfloat16 (every bfloat16 input).

`exp2_bits` below is that arithmetic in numpy (tests and analysis); `exp_rule`, `exp2_rule` give
XLA:CPU the same arithmetic in 32-bit integers while the chip's functions are on
(jaxbridge/chip_arithmetic.py). Other generations: the v5e's function, unverified.
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeAlias, cast

import jax
import numpy as np
from jax import lax
import jax.numpy as jnp

from pallas_check.jaxbridge.lowering import LoweringRuleContext, lower_fun

# Per segment of the fraction (its top 4 bits): the mantissa at the segment's start (units
# of 2**-23, a multiple of 32), its slope per 2**-23 (units of 2**-10 ulp) and its
# curvature per (2**-15)**2 (units of 2**-20 ulp). Exact: every recorded value agrees.
C0 = (-32, 371392, 759232, 1164256, 1587200, 2028864, 2490080, 2971712, 3474656, 3999904,
      4548416, 5121152, 5719328, 6343936, 6996128, 7677312)
A = (710, 741, 774, 808, 844, 881, 920, 961, 1004, 1048, 1094, 1143, 1193, 1246, 1302, 1359)
B = (1968, 2108, 2180, 2308, 2384, 2536, 2648, 2732, 2792, 2976, 3156, 3224, 3444, 3576, 3628,
     3868)
LOG2E = np.float32(1.4426950408889634)
# The arithmetic is written once for numpy (tests, analysis) and for JAX (the lowering).
Values: TypeAlias = "np.ndarray | jax.Array"
Lookup: TypeAlias = "Callable[[tuple[int, ...], Values], Values]"
_FRACTION_BITS = 23
_LIMIT = np.float32(200.0)  # beyond it every result is 0 or infinite alike


def _mantissa(fraction: Values, look: Lookup) -> Values:
    """The mantissa's 23 bits for a 23-bit fraction (any integer array type of 32 bits);
    `look(table, j)` is the segment's entry."""
    j = fraction >> 19
    u = fraction & ((1 << 19) - 1)
    h = u >> 8
    square = h * h
    slope_curvature = look(_AB, j)  # (A << 12) | B: one lookup for both
    a, b = slope_curvature >> 12, slope_curvature & 4095
    curvature = b * (square >> 10) + ((b * (square & 1023)) >> 10)  # floor(b h^2 / 2^10)
    return look(C0, j) + ((a * u + curvature) >> 10)


_AB = tuple((a << 12) | b for a, b in zip(A, B))


def exp2_bits(x: np.ndarray) -> np.ndarray:
    """The v5e's float32 exp2 of float32 `x` (numpy)."""
    x = np.asarray(x, np.float32)
    clamped = np.clip(np.nan_to_num(x, nan=0.0), -_LIMIT, _LIMIT)
    fixed = np.trunc(clamped * np.float32(1 << _FRACTION_BITS)).astype(np.int64)
    n = fixed >> _FRACTION_BITS
    mantissa = np.maximum(_mantissa(fixed & ((1 << _FRACTION_BITS) - 1),
                                    lambda table, j: np.asarray(table, np.int64)[j]), 0)
    biased = np.clip(n + 127, 0, 255)
    bits = (biased << 23) | mantissa
    bits = np.where(biased == 0, 0, np.where(biased == 255, 0x7F800000, bits))
    out = bits.astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), x, out)


def exp_bits(x: np.ndarray) -> np.ndarray:
    """The v5e's float32 exp of float32 `x` (numpy)."""
    x = np.asarray(x, np.float32)
    with np.errstate(over="ignore"):  # an infinite product is what the chip has too
        return exp2_bits((x * LOG2E).astype(np.float32))


def _select(table: tuple[int, ...], j: Values) -> Values:
    """table[j] for 0 <= j < 16 by a tree of selects on j's bits: on XLA:CPU twice as fast
    as a gather from a constant."""
    level: list[Values] = [np.asarray(v, np.int32) for v in table]
    for bit in range(4):
        odd = ((j >> bit) & 1) == 1
        level = [jnp.where(odd, level[2 * i + 1], level[2 * i]) for i in range(len(level) // 2)]
    return level[0]


def _exp2_jnp(x: Values) -> Values:
    """`exp2_bits` in JAX's 32-bit operations, for a float32 array (traced into the CPU
    lowering)."""
    clamped = jnp.clip(jnp.where(jnp.isnan(x), 0.0, x), -_LIMIT, _LIMIT)
    fixed = lax.convert_element_type(clamped * np.float32(1 << _FRACTION_BITS), np.int32)
    n = fixed >> _FRACTION_BITS  # arithmetic: the floor

    mantissa = jnp.maximum(_mantissa(fixed & ((1 << _FRACTION_BITS) - 1), _select), 0)
    biased = jnp.clip(n + 127, 0, 255)
    bits = (biased << 23) | mantissa
    bits = jnp.where(biased == 0, 0, jnp.where(biased == 255, 0x7F800000, bits))
    out = lax.bitcast_convert_type(bits.astype(np.int32), np.float32)
    return jnp.where(jnp.isnan(x), x, out)


def exp_jnp(x: Values) -> Values:
    """`exp_bits` in JAX's operations, for a float32 array."""
    return _exp2_jnp(x * LOG2E)


def applies(*dtypes: object) -> bool:
    """Whether the chip's function is modelled for an operand of `dtypes` (float32, and
    bfloat16 as float32 rounded)."""
    return all(dtype in (np.dtype(np.float32), np.dtype(jnp.bfloat16)) for dtype in dtypes)


def lowered(fn: Callable[..., Values]) -> Callable[..., Sequence[object]]:
    """A lowering rule computing `fn` (JAX operations) of its operands (the chip's
    functions here and in chip_divide.py)."""
    def rule(ctx: LoweringRuleContext, *operands: object) -> Sequence[object]:
        return cast(Sequence[object], lower_fun(lambda *xs: [fn(*xs)], ctx, *operands))
    return rule


def _in_float32(body: Callable[[Values], Values]) -> Callable[[jax.Array], Values]:
    """`body` of the operand widened to float32, rounded back to its type (a bfloat16
    function is the float32 one rounded, on every bfloat16 input)."""
    return lambda x: body(x.astype(np.float32)).astype(x.dtype)


exp_rule = lowered(_in_float32(exp_jnp))
exp2_rule = lowered(_in_float32(_exp2_jnp))
