"""The TPU's own conversions: `pltpu.pack_elementwise`, `pltpu.unpack_elementwise` and
`pltpu.stochastic_round`, as bit arithmetic on uint32 words.

Each value function takes its array module as `xp`: numpy for the engine's rules (below),
`jax.numpy` for the compiled tier (`compiled/tracing.py`), so both tiers compute the same
bits from one definition. Everything is integer arithmetic on uint32 plus `astype` between
float32 and the narrow float types, which numpy (ml_dtypes) and XLA:CPU do alike (round to
nearest even; an overflow is inf, or NaN where the type has no inf).

Where the semantics come from (JAX 0.10.2; Mosaic's `tpu` dialect as jaxlib 0.10.2 ships
it): `jax/_src/pallas/mosaic/primitives.py` (`pack_elementwise`, `unpack_elementwise` and
their docstrings and abstract evaluations; `stochastic_round`'s abstract evaluation),
`jax/_src/pallas/mosaic/lowering.py` (`_pack_elementwise_lowering_rule`,
`_unpack_elementwise_lowering_rule`, `_stochastic_round_lowering_rule`, and
`_dtype_to_ir_type`, which makes every integer type signless), the op descriptions of
`tpu.pack_elementwise` / `tpu.unpack_elementwise` in `jaxlib/mosaic/python/_tpu_ops_gen.py`,
and JAX's own chip tests of these ops (`tests/pallas/tpu_ops_test.py`:
`test_pack_elementwise`, `test_unpack_elementwise`, `test_stochastic_round`).
What a TPU v5e did (session 30, `hardware/`): the packing of `pack_elementwise_ok`
agreed with the chip bit for bit; `stochastic_round` to bfloat16 follows the chip's bit
rule (below), float8 targets the same rule, unverified.
"""

from __future__ import annotations

from types import ModuleType
from typing import NamedTuple, Sequence

import ml_dtypes
import numpy as np

from pallas_check.jaxbridge import params as eqn_params
from pallas_check.jaxbridge.primitives import (pack_elementwise_p, stochastic_round_p,
                                               unpack_elementwise_p)
from pallas_check.jaxbridge.types import JaxprEqn
from pallas_check.engine.events import event_kind
from pallas_check.engine.verdicts import Where
from pallas_check.engine.jaxpr.avals import aval_dtype
from pallas_check.engine.jaxpr.program import current_frames
from pallas_check.engine.jaxpr.registry import rule
from pallas_check.engine.seam import RunningCore


_NARROW_FLOATS = frozenset(np.dtype(t) for t in (
    ml_dtypes.bfloat16, ml_dtypes.float8_e5m2, ml_dtypes.float8_e4m3fn,
    ml_dtypes.float8_e4m3b11fnuz))


def bit_width(dtype: object) -> int:
    """The bits of one element (4 for int4, which numpy's itemsize cannot say)."""
    d = np.dtype(dtype)  # type: ignore[call-overload]  # (a dtype, a scalar type or a name)
    if d.kind == "f" or d in _NARROW_FLOATS:
        return int(ml_dtypes.finfo(d).bits)  # type: ignore[no-untyped-call]  # (ml_dtypes)
    return int(ml_dtypes.iinfo(d).bits)  # type: ignore[no-untyped-call]  # (int2/int4 too)


def _low_bits(width: int) -> int:
    return (1 << width) - 1


# -- pack / unpack -------------------------------------------------------------------------

def pack(xs: Sequence[object], packed: object, out_dtype: object, xp: ModuleType) -> object:
    """`pltpu.pack_elementwise(xs, packed_dtype=packed)`, as the op's description states:
    each element of the result is a word of the sources' width W, holding one value of
    each source, `xs[j]` in bits [j*w, (j+1)*w) (w the packed width: xs[0] lowest).

    - integers: the low w bits of each source's two's complement (the higher bits are
      dropped: int8 xxxx'1001 and yyyy'0011 packed to int4 make 0011'1001, the op's
      example);
    - float32 into bfloat16: each source rounded to bfloat16 to nearest, ties to even (as
      `astype` rounds: JAX's chip test compares with `astype(bfloat16)`), its 16 bits
      placed so; a NaN stays a NaN (its payload, and whether the chip flushes subnormals,
      not checked on a chip).

    The result is uint{W} (`out_dtype`), as the abstract evaluation makes it.
    """
    w = bit_width(packed)
    words = None
    for j, x in enumerate(xs):
        source = xp.asarray(x)
        if source.dtype == np.float32:
            bits = source.astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.uint32)
        else:
            bits = source.astype(np.uint32) & _low_bits(w)
        placed = bits << (j * w)
        words = placed if words is None else words | placed
    return xp.asarray(words).astype(out_dtype)


def unpack(x: object, index: int, packed: object, unpacked: object, xp: ModuleType) -> object:
    """`pltpu.unpack_elementwise(x, index=index, packed_dtype=packed,
    unpacked_dtype=unpacked)`: from each word of x, the w-bit field at bits
    [index*w, (index+1)*w) (index 0: the lowest bits, the op's description), widened:

    - to float32 from bfloat16: the field is a bfloat16's bits, widened exactly (its 16
      bits become the float32's high half);
    - to an integer: sign-extended from bit w-1 (the op's description: "s_y'y'", the sign
      of y repeated). Mosaic's integer types are signless (`_dtype_to_ir_type`), so an
      unsigned `packed_dtype` is sign-extended too (uint8 0xC8 unpacks to int32 -56, to
      uint32 0xFFFFFFC8): derived from the lowering, not checked on a chip.
    """
    w = bit_width(packed)
    field = (xp.asarray(x).astype(np.uint32) >> (index * w)) & _low_bits(w)
    if np.dtype(unpacked) == np.float32:  # type: ignore[call-overload]  # (a dtype)
        return (field << 16).view(np.float32)
    if w >= 32:
        return field.astype(unpacked)
    value = field.astype(np.int32)
    value = value - ((value & (1 << (w - 1))) << 1)
    return value.astype(unpacked)


# -- stochastic rounding ---------------------------------------------------------------------

class _Decision(NamedTuple):
    """What `stochastic_round` decides from, per element of x (uint32 arrays of `xp`:
    numpy's, or jax.numpy's traced ones in the compiled tier, which behave alike: typed as
    numpy's)."""

    sign: np.ndarray  # x's sign bit
    mag: np.ndarray  # x's bits without the sign
    field: np.ndarray  # x's exponent field (0: zero or subnormal, 255: inf or NaN)
    lo: np.ndarray  # x rounded toward zero onto the target's grid (magnitude bits)
    hi: np.ndarray  # the next grid value away from zero (magnitude bits)
    threshold: np.ndarray  # the fraction's top 23 bits: hi when (bits & 0x7FFFFF) < threshold


def _decision(x: object, target: object, xp: ModuleType) -> _Decision:
    """The fraction's 23-bit field and the two neighbours, as `stochastic_round` states."""
    finfo = ml_dtypes.finfo(target)  # type: ignore[no-untyped-call]  # (ml_dtypes)
    mant, emin = int(finfo.nmant), int(finfo.minexp)
    u = xp.asarray(x).view(np.uint32)
    sign, mag = u & np.uint32(0x80000000), u & np.uint32(0x7FFFFFFF)
    field = mag >> 23
    significand = (mag & np.uint32(0x7FFFFF)) | xp.where(field > 0, np.uint32(1 << 23),
                                                          np.uint32(0))
    exponent = xp.maximum(field, np.uint32(1)).astype(np.int32) - 127
    # The significand's low bits the target drops: k = (23 - mant) + how far x is below
    # the target's normal range (at least 16: mant <= 7).
    below = xp.maximum(emin - exponent, 0).astype(np.uint32)
    k = below + np.uint32(23 - mant)
    in_mantissa = k <= 23
    kept = xp.minimum(k, np.uint32(23))
    step = xp.left_shift(np.uint32(1), kept)
    low = step - np.uint32(1)
    rem = xp.where(in_mantissa, significand & low, significand)
    fraction = xp.where(k <= 32, rem << xp.subtract(np.uint32(32), xp.minimum(k, np.uint32(32))),
                        rem >> xp.minimum(k - np.uint32(32), np.uint32(31)))
    lo = xp.where(in_mantissa, mag & ~low, np.uint32(0))
    spacing = np.float32(2.0 ** (emin - mant)).view(np.uint32)
    hi = xp.where(in_mantissa, lo + step, spacing)
    # The chip compares 23 bits: the fraction's top 23 with the random word's low 23.
    return _Decision(sign, mag, field, lo, hi, fraction >> np.uint32(9))


def stochastic_round(x: object, random_bits: object, target: object, xp: ModuleType) -> object:
    """`pltpu.stochastic_round(x, random_bits, target_dtype=target)`: float32 x rounded to
    one of its two neighbours in `target` (bfloat16, float8_e5m2, float8_e4m3fn or
    float8_e4m3b11fnuz), the one away from zero when the low 23 bits of its element's
    uint32 `random_bits` are below its fraction; a float32 subnormal x gives zero.

    JAX 0.10.2 fixes the operands (float32 x, uint32 bits of x's shape) and its chip test
    the result (`lo`, x rounded toward zero onto the target's grid, or `hi`, the next grid
    value away from zero; x itself when x is on the grid). How the bits decide is the
    chip's, read off a TPU v5e (session 30, `hardware/chip/v5e/stochastic_round_bf16.npz`:
    512 x 128 draws to bfloat16, every one reproduced): the fraction is the dropped part
    of x's significand as a 23-bit field (for bfloat16, x's low 16 mantissa bits shifted
    up by 7), compared unsigned with `random_bits & 0x7FFFFF`; the top 9 random bits are
    ignored. So the probability of rounding away is fraction / 2^23 and the mean is x.
    The v5e also flushed the subnormal input 3 * 2^-130 to 0 (not to itself, which
    bfloat16 holds): a float32 subnormal x rounds to zero of x's sign here.

        fraction = floor((|x| - |lo|) / (|hi| - |lo|) * 2^23);  hi if (bits & 0x7FFFFF) < fraction

    Below the target's normal range the spacing is its subnormals'. The float8 targets
    follow the same 23-bit rule on the v5e (session 30, `hardware/chip/v5e/subnormals.npz`:
    512 draws of 128 values per target, subnormal, overflowing and negative ones among
    them, every draw reproduced). Beyond the target's largest finite value: inf for
    bfloat16 and float8_e5m2, NaN 0x7F (no sign) for float8_e4m3fn, the largest value
    (saturation) for float8_e4m3b11fnuz; a flushed zero is +0 for float8_e4m3fn. ±inf and
    NaN inputs convert as `astype` does (not probed).
    """
    finfo = ml_dtypes.finfo(target)  # type: ignore[no-untyped-call]  # (ml_dtypes)
    d = _decision(x, target, xp)
    sign, mag, field = d.sign, d.mag, d.field
    drawn = xp.asarray(random_bits).astype(np.uint32) & np.uint32(0x7FFFFF)
    rounded = xp.where(drawn < d.threshold, d.hi, d.lo)
    rounded = xp.where(field == 255, mag, rounded)  # inf and NaN pass as they are
    rounded = xp.where(field == 0, np.uint32(0), rounded)  # subnormals flush (the v5e)
    largest = np.float32(finfo.max).view(np.uint32)
    beyond = (rounded > largest) & (field != 255)
    kind = np.dtype(target)  # type: ignore[call-overload]  # (a dtype)
    if kind == np.dtype(ml_dtypes.float8_e4m3b11fnuz):
        rounded = xp.where(beyond, largest, rounded)  # the v5e saturates this type
    elif kind == np.dtype(ml_dtypes.float8_e4m3fn):
        # The v5e's NaN of an overflow and its flushed zero carry no sign (0x7F, 0x00).
        sign = xp.where(beyond | ((field == 0) & (mag != 0)), np.uint32(0), sign)
    return (sign | rounded).view(np.float32).astype(target)


# -- which random bits reach the rounding ------------------------------------------------------

# A set of the low 23 bits that never varies is reported when its weight -- over its bits,
# the words that bit decides, less one -- reaches this: uniform random words show such a set
# with a chance below 2^23 * 2^-64 = 2^-41 (each bit alone stays fixed over m words with
# chance 2^-(m-1); there are fewer than 2^23 sets).
LIKELY_WEIGHT = 64
_POSITIONS = np.left_shift(np.uint32(1), np.arange(23, dtype=np.uint32))


class BitsRead(NamedTuple):
    """Which of the low 23 bits of `stochastic_round`'s random words vary where they decide
    (scalars of `xp`: numpy's, or traced ones typed as numpy's). Bit p decides an element when the element's
    rounding depends on the bits at all (x off the target's grid by at least 2^-23 of a
    spacing, not a float32 subnormal, inf or NaN) and its threshold's lowest set bit is at
    most 2^p: `bits < threshold` never looks below that bit (for bfloat16, bits 0-6)."""

    words: np.ndarray  # the elements whose rounding the bits decide
    fixed: np.ndarray  # mask of the bits that decide some element and never vary where they do
    ones: np.ndarray  # of those, the bits fixed at 1
    weight: np.ndarray  # sum over the fixed bits of (the elements each decides - 1)
    none_random: np.ndarray  # every bit that decides some element is fixed: no randomness at all


def bits_read(x: object, random_bits: object, target: object, xp: ModuleType) -> BitsRead:
    """What the chip's rule reads of `random_bits` when it rounds x to `target`: one
    definition for both tiers (the engine's event, the compiled tier's verdict)."""
    d = _decision(x, target, xp)
    threshold = xp.reshape(d.threshold, (-1,))
    live = xp.reshape((d.field != 0) & (d.field != 255), (-1,)) & (threshold != 0)
    drawn = xp.reshape(xp.asarray(random_bits).astype(np.uint32), (-1,))
    lowest = threshold & (~threshold + np.uint32(1))  # the threshold's lowest set bit
    positions = xp.asarray(_POSITIONS)[:, None]
    decides = live[None, :] & (lowest[None, :] <= positions)
    ones = (drawn[None, :] & positions) != 0
    count = xp.sum(decides, axis=1, dtype=np.int32)
    fixed = (count > 0) & ~(xp.any(decides & ones, axis=1) & xp.any(decides & ~ones, axis=1))
    set_ones = fixed & xp.any(decides & ones, axis=1)
    bit = xp.asarray(_POSITIONS)
    return BitsRead(
        words=xp.sum(live, dtype=np.int32),
        fixed=xp.sum(xp.where(fixed, bit, np.uint32(0)), dtype=np.uint32),
        ones=xp.sum(xp.where(set_ones, bit, np.uint32(0)), dtype=np.uint32),
        weight=xp.sum(xp.where(fixed, count - 1, 0), dtype=np.int32),
        none_random=xp.any(count > 0) & xp.all(fixed | (count == 0)))


@event_kind
class RandomBitsFixed(NamedTuple):
    """A `pltpu.stochastic_round` whose random words keep some of the bits the chip's rule
    reads (the low 23) the same in every word where they decide (`conversions.bits_read`):
    the facts, for checkers/random.py to judge."""

    where: Where
    words: int  # the elements whose rounding the bits decide
    fixed: int  # mask of the bits fixed (of the low 23)
    ones: int  # of those, the ones fixed at 1
    weight: int  # how unlikely uniform random words are to look so (LIKELY_WEIGHT)
    none_random: bool  # every bit that decides is fixed: the rounding is deterministic
    target: str  # the target dtype's name


# -- the engine's rules ----------------------------------------------------------------------

@rule(pack_elementwise_p)
def _pack(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> object:
    return pack(invals, eqn_params.packed_dtype(eqn), aval_dtype(eqn.outvars[0]), np)


@rule(unpack_elementwise_p)
def _unpack(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> object:
    return unpack(invals[0], eqn_params.unpack_index(eqn), eqn_params.packed_dtype(eqn),
                  eqn_params.unpacked_dtype(eqn), np)


@rule(stochastic_round_p)
def _stochastic_round(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> object:
    target = eqn_params.rounding_target(eqn)
    if ctx.call.feeds.takes(RandomBitsFixed):
        read = bits_read(invals[0], invals[1], target, np)
        if int(read.fixed):
            where = Where(ctx.actor, ctx.device_id, ctx.core_id, ctx.grid_point,
                          current_frames(ctx))
            ctx.call.tell(RandomBitsFixed(
                where, int(read.words), int(read.fixed), int(read.ones), int(read.weight),
                bool(read.none_random), np.dtype(target).name))
    return stochastic_round(invals[0], invals[1], target, np)

