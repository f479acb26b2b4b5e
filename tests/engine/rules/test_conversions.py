"""`pltpu.pack_elementwise`, `pltpu.unpack_elementwise` and `pltpu.stochastic_round`
(issue 54 items 1-2): exact bit patterns of engine/rules/conversions.py, the compiled
tier's jax.numpy evaluation of the same definition equal to the engine's numpy one, and
the ops in a kernel on each tier.

The layouts are JAX 0.10.2's statement of the ops (docstrings, Mosaic's op descriptions,
JAX's chip tests); which random bits round stochastic_round up, and its flush of float32
subnormals, are a TPU v5e's (hardware/chip/v5e/stochastic_round_bf16.npz, replayed below).
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_check.config import Config
from pallas_check.config.model import Tier
from pallas_check.engine.rules.conversions import (LIKELY_WEIGHT, bits_read, pack,
                                                   stochastic_round, unpack)
from pallas_check.intercept.session import Session

BF16, E5M2, E4M3, B11 = (ml_dtypes.bfloat16, ml_dtypes.float8_e5m2,
                         ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3b11fnuz)
TARGETS = [BF16, E5M2, E4M3, B11]


def f32(bits):
    return np.array(bits, np.uint32).view(np.float32)


def bits_of(a):
    a = np.asarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def both(fn, *args):
    """fn's result with numpy (the engine) and jax.numpy under jit (the compiled tier),
    asserted bit-equal; the numpy one returned."""
    got = np.asarray(fn(*args, np))
    traced = np.asarray(jax.jit(lambda *a: fn(*a, jnp))(*args))
    np.testing.assert_array_equal(bits_of(got), bits_of(traced.astype(got.dtype)))
    return got


# -- pack ---------------------------------------------------------------------------------

def test_pack_int8_puts_the_first_source_in_the_lowest_byte_and_truncates():
    xs = [np.array([0x12, 0x1FF], np.int32), np.array([0x34, 0], np.int32),
          np.array([-1, 0], np.int32), np.array([0x80, -0x100], np.int32)]
    words = both(lambda *a: pack(a[:4], np.int8, np.uint32, a[4]), *xs)
    assert words.dtype == np.uint32
    assert [hex(w) for w in words] == ["0x80ff3412", "0xff"]


def test_pack_int4_is_the_ops_own_example():
    # int8 xxxx'1001 and yyyy'0011 packed to int4: 0011'1001.
    xs = [np.array([0b0110_1001], np.int8), np.array([0b0101_0011], np.int8)]
    word = both(lambda a, b, xp: pack([a, b], ml_dtypes.int4, np.uint8, xp), *xs)
    assert word.tolist() == [0b0011_1001]


def test_pack_bfloat16_rounds_to_nearest_even_first_source_low_half():
    lo = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, -0.0, np.inf], np.float32)
    hi = np.array([-2.0, 1 + 2**-8 + 2**-20, 0.0, np.nan, -np.inf], np.float32)
    words = both(lambda a, b, xp: pack([a, b], BF16, np.uint32, xp), lo, hi)
    # 1+2^-8 is a tie: to even 0x3F80; 1+3*2^-8 a tie: to even 0x3F82; above a tie: up.
    assert [hex(w) for w in words] == ["0xc0003f80", "0x3f813f80", "0x3f82",
                                       "0x7fc08000", "0xff807f80"]


def test_pack_int2_into_uint4_words():
    xs = [np.array([-1, 2, 5], ml_dtypes.int4), np.array([1, -2, 3], ml_dtypes.int4)]
    word = both(lambda a, b, xp: pack([a, b], ml_dtypes.int2, ml_dtypes.uint4, xp), *xs)
    assert word.astype(np.uint8).tolist() == [0b01_11, 0b10_10, 0b11_01]


# -- unpack -------------------------------------------------------------------------------

@pytest.mark.parametrize("index, want", [(0, 0x12), (1, 0x34), (2, -1), (3, -128)])
def test_unpack_int8_takes_field_index_and_sign_extends(index, want):
    word = np.array([0x80FF3412], np.uint32)
    got = both(lambda w, xp: unpack(w, index, np.int8, np.int32, xp), word)
    assert got.dtype == np.int32 and got.tolist() == [want]


def test_unpack_unsigned_packed_dtype_sign_extends_too():
    """Mosaic's integer types are signless (lowering.py `_dtype_to_ir_type`): the rule
    sign-extends a uint8 field as it does an int8 one (derived, not checked on a chip)."""
    word = np.array([0x000000C8], np.uint32)
    assert both(lambda w, xp: unpack(w, 0, np.uint8, np.int32, xp), word).tolist() == [-56]
    got = both(lambda w, xp: unpack(w, 0, np.uint8, np.uint32, xp), word)
    assert got.tolist() == [0xFFFFFFC8]


def test_unpack_bfloat16_widens_exactly():
    word = np.array([0xC0003F81, 0x7F80FF80], np.uint32)
    low = both(lambda w, xp: unpack(w, 0, BF16, np.float32, xp), word)
    high = both(lambda w, xp: unpack(w, 1, BF16, np.float32, xp), word)
    assert bits_of(low).tolist() == [0x3F810000, 0xFF800000]
    assert high.tolist() == [-2.0, np.inf]


def test_unpack_undoes_pack_for_every_width():
    rng = np.random.default_rng(1)
    for wide, narrow in [(np.int32, np.int16), (np.int32, np.int8), (np.int32, ml_dtypes.int4),
                         (np.int16, np.int8), (np.int8, ml_dtypes.int4)]:
        factor = np.dtype(wide).itemsize * 8 // (4 if narrow is ml_dtypes.int4
                                                 else np.dtype(narrow).itemsize * 8)
        xs = [rng.integers(-1000, 1000, 64).astype(wide) for _ in range(factor)]
        out = np.dtype(f"uint{np.dtype(wide).itemsize * 8}")
        words = pack(xs, narrow, out, np)
        for i, x in enumerate(xs):
            np.testing.assert_array_equal(unpack(words, i, narrow, wide, np),
                                          x.astype(narrow).astype(wide))


# -- stochastic_round ------------------------------------------------------------------------

ONE_AND_A_QUARTER_ULP = 0x3F804000  # 1 + 2^-9: a quarter of bfloat16's spacing above 1


@pytest.mark.parametrize("bits, want", [
    (0x00000000, 0x3F81), (0x001FFFFF, 0x3F81),   # low 23 bits below the fraction 0x200000
    (0xFF800000, 0x3F81),                         # (the top 9 bits do not count): up
    (0x00200000, 0x3F80), (0xFFFFFFFF, 0x3F80),   # at or above it: toward zero
])
def test_bfloat16_rounds_away_from_zero_when_bits_are_below_the_fraction(bits, want):
    x = f32([ONE_AND_A_QUARTER_ULP, ONE_AND_A_QUARTER_ULP | 0x80000000])
    got = both(lambda a, b, xp: stochastic_round(a, b, BF16, xp), x,
               np.array([bits, bits], np.uint32))
    assert bits_of(got).tolist() == [want, want | 0x8000]


def test_bfloat16_mean_over_every_value_of_bits_7_to_22_is_exactly_the_input():
    """For bfloat16 the decision depends on bits 7..22 only (the fraction's 23-bit field is
    a multiple of 2^7): over all 65536 values of them, exactly 0x4000 round up, so the mean
    is x exactly."""
    x = np.full(65536, f32(ONE_AND_A_QUARTER_ULP))
    bits = (np.arange(65536, dtype=np.uint32) << 7) | np.uint32(0xFF80005F)
    got = stochastic_round(x, bits, BF16, np).astype(np.float64)
    assert int((got > 1).sum()) == 0x4000
    assert got.mean() == float(x[0])


def test_a_value_on_the_grid_is_kept_whatever_the_bits():
    x = np.array([1.0, -0.5, 0.0, -0.0, 448.0, 2**-9], np.float32)
    for target in TARGETS:
        for bits in (0, 1, 0x80000000, 0xFFFFFFFF):
            got = both(lambda a, b, xp: stochastic_round(a, b, target, xp), x,
                       np.full(x.shape, bits, np.uint32))
            want = x.astype(target)
            if target is B11:  # 448 is beyond e4m3b11fnuz's 30: the v5e saturates
                want = np.clip(x, -30.0, 30.0).astype(target)
            np.testing.assert_array_equal(bits_of(got), bits_of(want))


@pytest.mark.parametrize("target, x, lo, hi", [
    (E4M3, 1.0625, 1.0, 1.125),       # half of e4m3fn's spacing 2^-3 above 1
    (E5M2, 1.125, 1.0, 1.25),         # half of e5m2's 2^-2
    (E4M3, 2.0**-10, 0.0, 2.0**-9),   # below the normal range: subnormal spacing 2^-9
    (B11, 2.0**-14, 0.0, 2.0**-13),   # e4m3b11fnuz: subnormal spacing 2^-13
])
def test_float8_half_fraction_splits_the_low_23_bits_at_two_to_the_22(target, x, lo, hi):
    xs = np.array([x, x], np.float32)
    got = both(lambda a, b, xp: stochastic_round(a, b, target, xp), xs,
               np.array([0xFFBFFFFF, 0x00400000], np.uint32))
    assert got.astype(np.float64).tolist() == [hi, lo]


def test_overflow_special_values_and_far_below_the_grid():
    # bfloat16: the largest float32 rounds to bfloat16's max or to inf.
    big = f32([0x7F7FFFFF, 0x7F7FFFFF])
    got = both(lambda a, b, xp: stochastic_round(a, b, BF16, xp), big,
               np.array([0, 0xFFFFFFFF], np.uint32))
    assert bits_of(got).tolist() == [0x7F80, 0x7F7F]
    # e4m3fn has no inf: above its max 448 the away-from-zero neighbour is NaN.
    got = both(lambda a, b, xp: stochastic_round(a, b, E4M3, xp),
               np.array([460.0, 460.0], np.float32), np.array([0, 0xFFFFFFFF], np.uint32))
    assert np.isnan(got[0]) and float(got[1]) == 448.0
    special = np.array([np.nan, np.inf, -np.inf, 1e-45], np.float32)
    zeros = np.zeros(4, np.uint32)
    got = both(lambda a, b, xp: stochastic_round(a, b, BF16, xp), special, zeros)
    assert np.isnan(got[0]) and got[1:3].tolist() == [np.inf, -np.inf]
    # 2^-149, a float32 subnormal, flushes to zero as on the v5e (bits 0 would round up).
    assert bits_of(got)[3] == 0x0000
    # ... and 2^-140 of e4m3fn's 2^-9: a fraction of 0, never rounded up.
    got = both(lambda a, b, xp: stochastic_round(a, b, E4M3, xp), special, zeros)
    assert np.isnan(got[:3]).all() and float(got[3]) == 0.0


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.__name__)
def test_result_is_a_neighbour_and_the_two_tiers_agree(target):
    rng = np.random.default_rng(54)
    x = (rng.standard_normal(4096) * np.exp2(rng.integers(-12, 6, 4096))).astype(np.float32)
    bits = rng.integers(0, 2**32, 4096, dtype=np.uint32)
    got = both(lambda a, b, xp: stochastic_round(a, b, target, xp), x, bits)
    near = x.astype(target)
    back = near.astype(np.float32)
    below = np.where(back > x, np.nextafter(near, target(-np.inf) if target in (BF16, E5M2)
                                             else -ml_dtypes.finfo(target).max), near)
    above = np.where(back < x, np.nextafter(near, target(np.inf) if target in (BF16, E5M2)
                                             else ml_dtypes.finfo(target).max), near)
    ok = (bits_of(got) == bits_of(below)) | (bits_of(got) == bits_of(above))
    inside = np.abs(x) <= float(ml_dtypes.finfo(target).max)  # (beyond: the overflow test)
    assert ok[inside].all() and inside.mean() > 0.9


# -- which random bits reach the rounding (random-misuse's facts) ---------------------------

def read(x, bits, target):
    """`bits_read`'s facts as ints, numpy's (the engine) asserted equal to jax.numpy's under
    jit (the compiled tier's verdict)."""
    fields = ("words", "fixed", "ones", "weight", "none_random")
    got = tuple(int(v) for v in bits_read(x, bits, target, np))
    traced = jax.jit(lambda a, b: tuple(bits_read(a, b, target, jnp)))(x, bits)
    assert got == tuple(int(v) for v in traced)
    return dict(zip(fields, got))


def _bf16_weight(x, bits_fixed):
    """The weight of `bits_fixed` for bfloat16 targets of normal float32 x, counted here
    from the rule's statement: x's 16 dropped bits, shifted up by 7, are its threshold, and
    bit p counts for the x whose threshold's lowest set bit is at most p."""
    threshold = (x.view(np.uint32) & 0xFFFF).astype(np.int64) << 7
    lowest = [int(t & -t) for t in threshold if t]
    return sum(sum(1 for low in lowest if low <= 1 << p) - 1
               for p in range(23) if bits_fixed >> p & 1)


def test_bits_in_the_top_byte_leave_every_bit_read_fixed():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(1024).astype(np.float32)
    x[:3] = [1.0, 0.0, np.inf]  # on the grid, zero, inf: the bits decide nothing there
    bits = rng.integers(0, 256, 1024, dtype=np.uint32) << 24
    facts = read(x, bits, BF16)
    # Bits 7-22 decide bfloat16's rounding of a normal float32 (its 16 dropped bits).
    assert facts == {"words": 1021, "fixed": 0x7FFF80, "ones": 0,
                     "weight": _bf16_weight(x[3:], 0x7FFF80), "none_random": 1}
    # Bit 7 counts for about half the values, bit 8 for 3/4, ...: 16 * 1020 less about 1020.
    assert 14 * 1020 < facts["weight"] < 16 * 1020


def test_sixteen_random_bits_at_the_top_leave_bits_7_to_15_fixed():
    rng = np.random.default_rng(4)
    x = rng.standard_normal(1024).astype(np.float32)
    bits = rng.integers(0, 2**16, 1024, dtype=np.uint32) << 16
    facts = read(x, bits, BF16)
    assert facts["fixed"] == 0xFF80 and facts["none_random"] == 0
    assert facts["weight"] == _bf16_weight(x, 0xFF80)


@pytest.mark.parametrize("target, unread", [(BF16, 7), (E5M2, 2), (E4M3, 3), (B11, 3)],
                         ids=lambda t: getattr(t, "__name__", str(t)))
def test_bits_below_the_thresholds_lowest_bit_are_not_read(target, unread):
    """A normal float32 x rounds by its dropped significand bits: the threshold's low
    `unread` bits are 0, so `bits < threshold` never looks at them; fixing them is fine,
    fixing the next bit is not."""
    rng = np.random.default_rng(5)
    x = (1 + rng.random(2048)).astype(np.float32)  # normal in every target
    bits = rng.integers(0, 2**32, 2048, dtype=np.uint32)
    below = np.uint32((1 << unread) - 1)
    assert read(x, bits & ~below, target)["fixed"] == 0
    facts = read(x, bits & ~np.uint32((1 << (unread + 1)) - 1), target)
    assert facts["fixed"] == 1 << unread and facts["weight"] >= LIKELY_WEIGHT


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.__name__)
def test_the_chips_own_random_words_fix_no_bit(target):
    """The v5e probe's words (jax.random.bits, 512 per value) against each target's 128
    values, the subnormal and overflowing ones among them: nothing fixed."""
    chip = np.load(Path(__file__).resolve().parents[3] / "hardware" / "chip" / "v5e"
                   / "subnormals.npz")
    facts = read(chip[f"sr.{np.dtype(target).name}.x"], chip["sr.bits"], target)
    assert facts["words"] > 0 and facts["fixed"] == 0 and facts["weight"] == 0


# -- in a kernel, each tier ----------------------------------------------------------------

def _kernel(x_ref, bits_ref, a_ref, words_ref, rounded_ref, back_ref):
    words = pltpu.pack_elementwise([a_ref[0], a_ref[1]], packed_dtype=jnp.int16)
    words_ref[...] = words
    back_ref[...] = pltpu.unpack_elementwise(words, index=1, packed_dtype=jnp.int16,
                                             unpacked_dtype=jnp.int32)
    rounded_ref[...] = pltpu.stochastic_round(x_ref[...], bits_ref[...],
                                              target_dtype=jnp.float8_e5m2)


@pytest.mark.parametrize("tier", [Tier.ENGINE, Tier.COMPILED])
def test_the_ops_in_a_kernel(tier):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((8, 128)).astype(np.float32)
    bits = rng.integers(0, 2**32, (8, 128), dtype=np.uint32)
    a = rng.integers(-2**31, 2**31, (2, 8, 128), dtype=np.int32)
    session = Session(Config(tier=tier))
    with session.install():
        outs = pl.pallas_call(_kernel, out_shape=[
            jax.ShapeDtypeStruct((8, 128), jnp.uint32),
            jax.ShapeDtypeStruct((8, 128), jnp.float8_e5m2),
            jax.ShapeDtypeStruct((8, 128), jnp.int32)])(x, bits, a)
        words, rounded, back = (np.asarray(o) for o in jax.block_until_ready(outs))
    assert session.engine_error is None and session.findings == []
    want = (a[0].astype(np.uint32) & 0xFFFF) | (a[1].astype(np.uint32) << 16)
    np.testing.assert_array_equal(words, want)
    np.testing.assert_array_equal(back, a[1].astype(np.int16).astype(np.int32))
    np.testing.assert_array_equal(bits_of(rounded),
                                  bits_of(stochastic_round(x, bits, E5M2, np)))


def test_the_v5e_draws_replayed_bit_for_bit():
    """256 x 128 of a v5e's stochastic roundings to bfloat16 (session 30's recording of
    samples/stochastic_round_ok.py: 128 values down the columns, random words from
    jax.random.bits), the subnormal 3 * 2^-130 of column 4 among them, which the chip
    flushed to 0: every result reproduced on both tiers' arithmetic."""
    chip = np.load(Path(__file__).resolve().parents[3] / "hardware" / "chip" / "v5e"
                   / "stochastic_round_bf16.npz")
    got = both(lambda a, b, xp: stochastic_round(a, b, BF16, xp), chip["x"], chip["bits"])
    assert bits_of(got).shape == chip["out"].shape
    np.testing.assert_array_equal(bits_of(got), chip["out"])
    assert (chip["out"][:, 4] == 0).all() and chip["x"][0, 4] == np.float32(3 * 2.0**-130)


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.__name__)
def test_the_v5e_draws_to_every_target_replayed_bit_for_bit(target):
    """hardware/probes/subnormals.py on a v5e (session 30): 512 random words for each of
    128 values per target, the float32 subnormals, the target's own subnormal range, values
    just beyond its largest finite one (NaN 0x7F for e4m3fn, saturation for e4m3b11fnuz,
    inf for bfloat16 and e5m2) and 1e30 among them: every draw reproduced."""
    chip = np.load(Path(__file__).resolve().parents[3] / "hardware" / "chip" / "v5e"
                   / "subnormals.npz")
    name = np.dtype(target).name
    got = both(lambda a, b, xp: stochastic_round(a, b, target, xp), chip[f"sr.{name}.x"],
               chip["sr.bits"])
    np.testing.assert_array_equal(bits_of(got), chip[f"sr.{name}.out"])
