"""A TPU v5e's float32 reciprocal and division, bit for bit.

Why: the chip divides by multiplying with a reciprocal that is one Newton step from a
hardware estimate, not the correctly rounded quotient (24 % of reciprocals one ulp or more
away); a softmax's `p / l` rounded to bfloat16 for the MXU can then round the other way
than XLA:CPU's exact division makes it (the last flash attention elements by which a replay
of the kernel repository differed from the chip after session 33's exp, hardware/README.md).

What the chip does (hardware/probes/exp_verify.py and exp_bits.py, session 33; a Pallas
kernel and XLA:TPU alike):

- the estimate (`pl.reciprocal(x, approx=True)`, within 1.6e-5): for b = 2**e * m, m in
  [1, 2), the estimate is 2**-e times (1 + M * 2**-23) / 2, M from m's 23 fraction bits as
  the chip's exp2 does it (chip_exp.py): the top 4 bits choose one of 16 segments, the other
  19 (u; h: u's top 11) give `M = C0[j] + floor((A[j] u + floor(B[j] h^2 / 2^10)) / 2^10)`,
  never below 0; a result below 2**-126 is 0; a zero or subnormal b gives an infinity;
- `1 / b` is `r + r * (1 - b * r)` of that estimate r, each operation in float32 with
  subnormal results flushed to zero (b = +-2**126 gives +-2**-126);
- `a / b` is `a * (1 / b)`.

Every one of 2**21 estimates and reciprocals on a grid of [1, 2), 2**20 random reciprocals
and quotients over 2**+-12, and the reciprocals of all 65536 bfloat16 values reproduced
(tests/jaxbridge/test_chip_divide.py). Other generations: the v5e's, unverified.
"""

from __future__ import annotations

import numpy as np
from jax import lax
import jax.numpy as jnp

from pallas_check.jaxbridge.chip_exp import Lookup, Values, _select, lowered

# Per segment of the fraction's top 4 bits: the estimate's mantissa at the segment's start
# (units of 2**-23 of the estimate's doubled value), slope (units of 2**-10 of that per
# 2**-23 of m) and curvature (2**-20 per (2**-15)**2). Fitted exactly from the grid.
C0 = (8388480, 7401728, 6524416, 5739648, 5033088, 4393984, 3813120, 3282560, 2796032,
      2348928, 1935872, 1553536, 1198336, 867840, 559360, 270464)
A = (-2044, -1812, -1616, -1452, -1308, -1188, -1084, -992, -908, -840, -776, -720, -668,
     -624, -584, -544)
B = (14960, 12672, 10656, 9280, 7664, 6832, 6144, 5408, 4384, 4288, 3744, 3392, 2864, 2736,
     2592, 1984)
_SMALLEST = np.float32(2.0 ** -126)
_EDGE = np.float32(2.0 ** 126)  # the one b whose reciprocal the chip keeps normal


def _estimate_fields(bits: Values, look: Lookup) -> tuple[Values, Values]:
    """The estimate's biased exponent and 23 mantissa bits for float32 `bits` (int arrays)."""
    exponent = (bits >> 23) & 255
    fraction = bits & ((1 << 23) - 1)
    j = fraction >> 19
    u = fraction & ((1 << 19) - 1)
    square = (u >> 8) * (u >> 8)
    b = look(B, j)
    curvature = b * (square >> 10) + ((b * (square & 1023)) >> 10)
    return 253 - exponent, look(C0, j) + ((look(A, j) * u + curvature) >> 10)


def _np_look(table: tuple[int, ...], j: Values) -> Values:
    return np.asarray(table, np.int64)[j]


def _flush(v: np.ndarray) -> np.ndarray:
    v = np.asarray(v, np.float32)
    return np.where(np.abs(v) < _SMALLEST, np.copysign(np.float32(0), v), v).astype(np.float32)


def estimate_bits(b: np.ndarray) -> np.ndarray:
    """The v5e's `pl.reciprocal(b, approx=True)` of float32 `b` (numpy)."""
    b = np.asarray(b, np.float32)
    bits = b.view(np.uint32).astype(np.int64)
    biased, mantissa = _estimate_fields(bits, _np_look)
    sign = (bits >> 31) << 31
    out = sign | (np.clip(biased, 0, 255) << 23) | np.maximum(mantissa, 0)
    out = np.where(biased <= 0, sign, out).astype(np.uint32).view(np.float32)
    zero = ((bits >> 23) & 255) == 0
    out = np.where(zero, np.copysign(np.float32(np.inf), b), out)
    out = np.where(np.isinf(b), np.copysign(np.float32(0), b), out)
    return np.where(np.isnan(b), b, out).astype(np.float32)


def reciprocal_bits(b: np.ndarray) -> np.ndarray:
    """The v5e's float32 `1 / b` (numpy)."""
    b = np.asarray(b, np.float32)
    with np.errstate(all="ignore"):
        r = estimate_bits(b)
        error = _flush(np.float32(1) - _flush(b * r))
        out = _flush(r + _flush(r * error))
        special = ~np.isfinite(r) | (r == 0) | ~np.isfinite(b)
        out = np.where(special, r, out)
        out = np.where(np.abs(b) == _EDGE, np.copysign(_SMALLEST, b), out)
    return out.astype(np.float32)


def divide_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The v5e's float32 `a / b` (numpy)."""
    with np.errstate(all="ignore"):
        return _flush(np.asarray(a, np.float32) * reciprocal_bits(b))


def _estimate_jnp(b: Values) -> Values:
    """`estimate_bits` in JAX's 32-bit operations (traced into the CPU lowering)."""
    bits = lax.bitcast_convert_type(b, np.int32)
    biased, mantissa = _estimate_fields(bits, _select)
    sign = bits & np.int32(-(1 << 31))
    out = sign | (jnp.clip(biased, 0, 255) << 23) | jnp.maximum(mantissa, 0)
    out = lax.bitcast_convert_type(jnp.where(biased <= 0, sign, out), np.float32)
    infinity = jnp.where(bits < 0, -np.inf, np.inf).astype(np.float32)
    out = jnp.where(((bits >> 23) & 255) == 0, infinity, out)
    out = jnp.where(jnp.isinf(b), jnp.where(bits < 0, np.float32(-0.0), np.float32(0.0)), out)
    return jnp.where(jnp.isnan(b), b, out)


def _flush_jnp(v: Values) -> Values:
    return jnp.where(jnp.abs(v) < _SMALLEST, v * np.float32(0), v)


def reciprocal_jnp(b: Values) -> Values:
    """`reciprocal_bits` in JAX's operations (XLA:CPU flushes subnormal products as the
    chip does; the explicit flushes make sums and differences do so too)."""
    r = _estimate_jnp(b)
    error = _flush_jnp(np.float32(1) - _flush_jnp(b * r))
    out = _flush_jnp(r + _flush_jnp(r * error))
    special = ~jnp.isfinite(r) | (r == 0) | ~jnp.isfinite(b)
    out = jnp.where(special, r, out)
    return jnp.where(jnp.abs(b) == _EDGE, jnp.where(b < 0, -_SMALLEST, _SMALLEST), out)


def applies(*dtypes: object) -> bool:
    """Whether the chip's division is modelled for operands of `dtypes` (float32 only;
    a bfloat16 reciprocal is the float32 one rounded except at 2**126, unmodelled)."""
    return all(dtype == np.dtype(np.float32) for dtype in dtypes)


divide_rule = lowered(lambda a, b: _flush_jnp(a * reciprocal_jnp(b)))
reciprocal_rule = lowered(reciprocal_jnp)
estimate_rule = lowered(_estimate_jnp)
