"""`random-misuse` (checkers/random.py): one random stream seeded alike at several grid
points and drawn from at each, and stochastic rounding fed random bits the chip's rule does
not read (the low 23 bits of each word: hardware/README.md, "Stochastic rounding and
subnormals"); each with its exact buffer and line, and none where the kernel is right."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_check.checkers.random import BITS_BUFFER, SEED_BUFFER
from pallas_check.config import Config
from pallas_check.config.model import Tier

BLOCK = (8, 128)
STEPS = 4


def _line(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    [hit] = [first + k for k, line in enumerate(lines) if text in line]
    return hit


def _found(r):
    """(kind, buffer, line, grid point, count) of each finding."""
    assert r.session.engine_error is None, r.session.engine_error
    return sorted((f.kind.value, f.buffer, f.frames[0].line, f.grid_point, f.count)
                  for f in r.findings)


def _grid_call(kernel, steps=STEPS, **params):
    """`kernel(seed_ref, o_ref)` over `steps` grid steps, an (8, 128) int32 block each."""
    spec = pl.BlockSpec(BLOCK, lambda i, s: (i, 0))
    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((steps * BLOCK[0], BLOCK[1]), jnp.int32),
        grid_spec=pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(steps,),
                                               in_specs=[], out_specs=spec), **params)
    return lambda: call(jnp.array([7], jnp.int32))


# -- one stream at several grid points ---------------------------------------------------------

def _same_seed(seed_ref, o_ref):
    pltpu.prng_seed(seed_ref[0])  # the seed
    o_ref[...] = pltpu.prng_random_bits(BLOCK)


def test_the_same_seed_at_every_grid_point_is_one_finding_at_the_seed(check):
    r = check(_grid_call(_same_seed))
    line = _line(_same_seed, "# the seed")
    assert _found(r) == [("random-misuse", SEED_BUFFER, line, (1,), STEPS - 1)]
    [finding] = r.findings
    assert finding.message == (
        "the core's PRNG is seeded with the same values (7) at grid point (0,) and at grid"
        " point (1,), and drawn from at both: both draw the same random numbers")
    assert "pl.program_id" in finding.help and "ignore[random-misuse]" in finding.help
    blocks = np.asarray(r.value).reshape(STEPS, -1)
    assert len({b.tobytes() for b in blocks}) == 1  # what the finding says


def _seed_with_point(seed_ref, o_ref):
    pltpu.prng_seed(seed_ref[0], pl.program_id(0))
    o_ref[...] = pltpu.stateful_bits(BLOCK, jnp.uint32).astype(jnp.int32)


def _seed_once(seed_ref, o_ref):
    @pl.when(pl.program_id(0) == 0)
    def _():
        pltpu.prng_seed(seed_ref[0])

    o_ref[...] = pltpu.prng_random_bits(BLOCK)  # the stream goes on across the steps


def _draw_at_first_step_only(seed_ref, o_ref):
    pltpu.prng_seed(seed_ref[0])
    o_ref[...] = jnp.zeros(BLOCK, jnp.int32)

    @pl.when(pl.program_id(0) == 0)
    def _():
        o_ref[...] = pltpu.prng_random_bits(BLOCK)


@pytest.mark.parametrize("kernel, steps", [(_seed_with_point, STEPS), (_seed_once, STEPS),
                                           (_draw_at_first_step_only, STEPS),
                                           (_same_seed, 1)],
                         ids=["seeded-with-the-point", "seeded-once", "drawn-once",
                              "one-step"])
def test_no_finding_where_each_step_draws_its_own_numbers(check, kernel, steps):
    r = check(_grid_call(kernel, steps))
    assert _found(r) == []


def test_two_cores_of_a_parallel_grid_seeded_alike(check):
    call = _grid_call(_same_seed, 2, compiler_params=pltpu.CompilerParams(
        dimension_semantics=("parallel",)))
    r = check(call, config=Config(cores=2))
    assert _found(r) == [("random-misuse", SEED_BUFFER, _line(_same_seed, "# the seed"),
                          (1,), 1)]
    assert "of core 0" in r.findings[0].message and "of core 1" in r.findings[0].message


def _sampled_key(key_ref, o_ref):
    o_ref[...] = jax.random.bits(key_ref[0, 0], BLOCK).astype(jnp.int32)  # the draw


def _folded_key(key_ref, o_ref):
    key = jax.random.fold_in(key_ref[0, 0], pl.program_id(0))
    o_ref[...] = jax.random.bits(key, BLOCK).astype(jnp.int32)


@pytest.mark.parametrize("kernel, found", [(_sampled_key, True), (_folded_key, False)])
def test_a_pallas_key_drawn_unchanged_at_every_grid_point(check, kernel, found):
    key = pltpu.to_pallas_key(jax.random.key(0))[None, None]
    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((STEPS * BLOCK[0], BLOCK[1]), jnp.int32),
        grid=(STEPS,), in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)],
        out_specs=pl.BlockSpec(BLOCK, lambda i: (i, 0)))
    r = check(call, key)
    want = [("random-misuse", SEED_BUFFER, _line(_sampled_key, "# the draw"), (1,),
             STEPS - 1)] if found else []
    assert _found(r) == want
    if found:
        assert r.findings[0].message.startswith("random bits are drawn from the same key")
        assert "jax.random.fold_in(key, pl.program_id(0))" in r.findings[0].help


def _threefry(o_ref):
    o_ref[...] = jax.random.bits(jax.random.key(3), BLOCK)  # a JAX key


def test_a_jax_key_drawn_unchanged_at_every_grid_point(check):
    call = pl.pallas_call(
        _threefry, out_shape=jax.ShapeDtypeStruct((2 * BLOCK[0], BLOCK[1]), jnp.uint32),
        grid=(2,), out_specs=pl.BlockSpec(BLOCK, lambda i: (i, 0)))
    r = check(call)
    assert _found(r) == [("random-misuse", SEED_BUFFER, _line(_threefry, "# a JAX key"),
                          (1,), 1)]


# -- stochastic rounding fed bits the chip does not read -----------------------------------

def _round_kernel(x_ref, bits_ref, o_ref):
    o_ref[...] = pltpu.stochastic_round(x_ref[...], bits_ref[...],  # the round
                                        target_dtype=jnp.bfloat16)


def _round(x, bits, steps=2):
    rows = x.shape[0] // steps
    return pl.pallas_call(
        _round_kernel, grid=(steps,),
        in_specs=[pl.BlockSpec((rows, 128), lambda i: (i, 0))] * 2,
        out_specs=pl.BlockSpec((rows, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, jnp.bfloat16))(x, bits)


def _values(rows=64):
    return np.random.default_rng(54).standard_normal((rows, 128)).astype(np.float32)


def _words(dtype, shift, rows=64):
    bits = jax.random.bits(jax.random.key(1), (rows, 128), dtype)
    return bits.astype(jnp.uint32) << shift


ROUND_LINE = _line(_round_kernel, "# the round")


def test_random_bits_in_the_top_byte_reach_no_rounding(check):
    r = check(_round, _values(), _words(jnp.uint8, 24))
    assert _found(r) == [("random-misuse", BITS_BUFFER, ROUND_LINE, (0,), 2)]
    message = r.findings[0].message
    assert "bits 7-22" in message and "are 0x0 in all 4096 words" in message, message
    assert message.endswith("(away from zero)")
    # As the chip does: every value off the grid rounded away from zero.
    out = np.asarray(r.value).astype(np.float32)
    x = _values()
    assert np.all(np.abs(out) >= np.abs(x))


def test_sixteen_random_bits_shifted_to_the_top_leave_bits_7_to_15_fixed(check):
    r = check(_round, _values(), _words(jnp.uint16, 16))
    assert _found(r) == [("random-misuse", BITS_BUFFER, ROUND_LINE, (0,), 2)]
    assert "the random words' bits 7-15 never vary" in r.findings[0].message


@pytest.mark.parametrize("bits", [
    _words(jnp.uint32, 0),  # whole words
    _words(jnp.uint16, 7),  # 16 random bits where bfloat16's rounding reads them
    # Bits 0-6 and the top 9 fixed: a bfloat16 rounding never reads them.
    _words(jnp.uint16, 7) | np.uint32(0xFF80005F),
], ids=["uint32", "uint16-low", "low-7-and-top-9-fixed"])
def test_no_finding_where_every_bit_read_is_random(check, bits):
    r = check(_round, _values(), jnp.asarray(bits))
    assert _found(r) == []


def test_too_few_words_to_tell_are_not_a_finding(check):
    """1 + 2^-9 + 2^-23 rounds to bfloat16 by bits 7-22 (its threshold's lowest bit is bit 7):
    those fixed over five such words weigh 16 * (5 - 1) = 64 (conversions.LIKELY_WEIGHT,
    reported), over four 48 (not: below the bar every report keeps, whatever the bits)."""
    for off_grid, want in ((4, []), (5, [("random-misuse", BITS_BUFFER, ROUND_LINE, (0,), 1)])):
        x = np.ones((8, 128), np.float32)
        x.flat[:off_grid] = 1 + 2.0 ** -9 + 2.0 ** -23
        r = check(lambda a, b: _round(a, b, 1), x, jnp.zeros((8, 128), jnp.uint32))
        assert _found(r) == want, off_grid


@pytest.mark.parametrize("bits, want", [
    (_words(jnp.uint8, 24), [("random-misuse", BITS_BUFFER, ROUND_LINE, (0,), 2)]),
    (_words(jnp.uint32, 0), []),
], ids=["top-byte", "uint32"])
def test_the_compiled_tier_finds_what_the_engine_finds(check, bits, want):
    r = check(jax.jit(_round), _values(), bits, config=Config(tier=Tier.COMPILED))
    assert _found(r) == want
    [call] = r.session.calls
    if want:
        assert call.tier == "engine" and call.tier_reason == (
            "the compiled run saw random-bits-fixed"), (call.tier, call.tier_reason)
    else:
        assert call.tier == "compiled", call.tier_reason
