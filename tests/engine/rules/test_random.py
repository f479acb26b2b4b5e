"""In-kernel random numbers (engine/rules/random.py): the core's PRNG under
`pltpu.prng_seed` / `prng_random_bits` and the `pltpu.stateful_*` samplers, and typed
`key<pl>` keys as operands (`pltpu.to_pallas_key`, `pltpu.sample_block`): deterministic
for a seed, a stream per seed and grid point, the chip's ranges and distributions
(issue 54, items 3 and 4). JAX's HLO interpreter draws all-zero bits here, so there is
no oracle; the properties are checked instead."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_check.config import Config
from pallas_check.config.model import Tier
from pallas_check.jaxbridge import keys
from pallas_check.engine.rules.random import _fold_round
from pallas_check.intercept.session import Session

BLOCK = (8, 128)


def _checked(check, fn, *args, config=None):
    r = check(fn, *args, config=config)
    assert r.session.engine_error is None, r.session.engine_error
    assert r.findings == [], [f.message for f in r.findings]
    assert r.session.calls, "the pallas_call was not intercepted"
    return [np.asarray(v) for v in jax.tree.leaves(r.value)]


def _stateful(seed, steps=4, seed_with_point=True):
    def kernel(seed_ref, u_ref, n_ref, b_ref, bits_ref, raw_ref):
        if seed_with_point:
            pltpu.prng_seed(seed_ref[0], pl.program_id(0))
        else:
            pltpu.prng_seed(seed_ref[0])
        u_ref[...] = pltpu.stateful_uniform(BLOCK, jnp.float32)
        n_ref[...] = pltpu.stateful_normal(BLOCK, jnp.float32)
        b_ref[...] = pltpu.stateful_bernoulli(0.25, BLOCK).astype(jnp.int32)
        bits_ref[...] = pltpu.stateful_bits(BLOCK, jnp.uint32)
        raw_ref[...] = pltpu.prng_random_bits(BLOCK)

    shape = (steps * BLOCK[0], BLOCK[1])
    spec = pl.BlockSpec(BLOCK, lambda i, s: (i, 0))
    dtypes = (jnp.float32, jnp.float32, jnp.int32, jnp.uint32, jnp.int32)
    return pl.pallas_call(
        kernel, out_shape=[jax.ShapeDtypeStruct(shape, d) for d in dtypes],
        grid_spec=pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(steps,),
                                               in_specs=[], out_specs=[spec] * 5),
    )(jnp.array([seed], jnp.int32))


def test_stateful_samplers_have_the_chips_ranges_and_moments(check):
    u, n, b, bits, raw = _checked(check, _stateful, 3)
    assert 0.0 <= u.min() and u.max() < 1.0
    # Uniforms are JAX's: 23 random mantissa bits, so multiples of 2**-23.
    assert np.all((u * 2.0 ** 23) == np.floor(u * 2.0 ** 23))
    assert abs(u.mean() - 0.5) < 0.02 and abs(u.var() - 1 / 12) < 0.01
    assert abs(n.mean()) < 0.06 and 0.93 < n.std() < 1.07
    assert abs(np.mean(np.abs(n) < 1) - 0.6827) < 0.03  # normal, not just scaled
    assert set(np.unique(b)) <= {0, 1} and abs(b.mean() - 0.25) < 0.03
    assert bits.dtype == np.uint32 and raw.dtype == np.int32
    # Every bit is random: each of the 32 is set about half the time (not all zeros,
    # as JAX's interpreter draws).
    per_bit = [np.mean((bits >> k) & 1) for k in range(32)]
    assert min(per_bit) > 0.45 and max(per_bit) < 0.55


def test_same_seed_same_bits_other_seeds_and_points_other_bits(check):
    first = _checked(check, _stateful, 5)
    again = _checked(check, _stateful, 5)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    other = _checked(check, _stateful, 6)
    assert np.mean(other[3] == first[3]) < 0.01
    blocks = first[3].reshape(4, -1)
    assert len({row.tobytes() for row in blocks}) == 4  # a stream per grid point


def test_a_seed_without_the_grid_point_repeats_at_every_point(check):
    """As on the chip: the PRNG's state is what the seed makes it, wherever it is set (and
    the kernel is told so: a random-misuse finding, tests/checkers/test_random.py)."""
    r = check(functools.partial(_stateful, seed_with_point=False), 5)
    assert r.session.engine_error is None, r.session.engine_error
    assert [(f.kind.value, f.count) for f in r.findings] == [("random-misuse", 3)]
    bits = np.asarray(r.value[3])
    blocks = bits.reshape(4, -1)
    assert len({row.tobytes() for row in blocks}) == 1


def test_each_core_has_its_own_stream_before_any_seed(check):
    def kernel(o_ref):
        o_ref[...] = pltpu.prng_random_bits(BLOCK)

    def unseeded():
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((2 * BLOCK[0], BLOCK[1]), jnp.int32),
            grid=(2,), out_specs=pl.BlockSpec(BLOCK, lambda i: (i, 0)),
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)))()

    (bits,) = _checked(check, unseeded, config=Config(cores=2))
    halves = bits.reshape(2, -1)
    assert halves[0].tobytes() != halves[1].tobytes()


TOTAL, TILE = (32, 256), (8, 128)


def _sampled(key, block=(16, 128)):
    def kernel(key_ref, o_ref):
        o_ref[...] = pltpu.sample_block(jax.random.uniform, key_ref[0, 0], block_size=block,
                                        tile_size=TILE, total_size=TOTAL)

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(TOTAL, jnp.float32),
        grid=(TOTAL[0] // block[0], TOTAL[1] // block[1]),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)],
        out_specs=pl.BlockSpec(block, lambda i, j: (i, j)))(key)


def _pallas_key(seed):
    return pltpu.to_pallas_key(jax.random.key(seed))[None, None]


def test_a_key_operand_samples_blocks_invariant_to_the_block_size(check):
    (out,) = _checked(check, jax.jit(_sampled), _pallas_key(0))
    assert 0.0 <= out.min() and out.max() < 1.0 and abs(out.mean() - 0.5) < 0.02
    (same,) = _checked(check, jax.jit(functools.partial(_sampled, block=(32, 128))),
                       _pallas_key(0))
    np.testing.assert_array_equal(same, out)
    (other,) = _checked(check, jax.jit(_sampled), _pallas_key(1))
    assert np.mean(other == out) < 0.01
    tiles = out.reshape(4, TILE[0], 2, TILE[1]).transpose(0, 2, 1, 3).reshape(8, -1)
    assert len({t.tobytes() for t in tiles}) == 8


def test_the_compiled_tier_leaves_a_key_operand_to_the_engine(check):
    """Under --tier compiled the call is refused with the reason (under auto: the engine)."""
    with pytest.raises(Exception, match="cannot run compiled: a typed PRNG key operand"):
        check(jax.jit(_sampled), _pallas_key(0), config=Config(tier=Tier.COMPILED))


def test_fold_in_is_jaxs_threefry_round():
    """JAX's `fold_in` for a Pallas key: key1 += data, then one threefry round (13)."""
    from jax._src.random import threefry2x32  # the reference, in the test only

    k0, k1, data = np.uint32(0x12345678), np.uint32(0xFEDCBA98), np.uint32(77)
    want = threefry2x32.apply_round([jnp.uint32(k0), jnp.uint32(k1) + jnp.uint32(data)], 13)
    got = _fold_round(np.array([k0]), np.array([k1 + data], np.uint32))
    assert [int(g[0]) for g in got] == [int(w) for w in want]


def test_keys_as_words_and_back():
    key = _pallas_key(3)
    dtype = key.dtype
    assert keys.is_key_dtype(dtype) and keys.key_shape(dtype) == (1, 2)
    words = np.asarray(jax.random.key_data(key))
    held = keys.to_logical(words, dtype)
    assert held.shape == (1, 1) and held.dtype == keys.numpy_dtype(dtype)
    np.testing.assert_array_equal(keys.to_physical(held), words)
    np.testing.assert_array_equal(keys.words(held), words)


def test_a_threefry_key_made_in_the_kernel_draws_jaxs_bits(check):
    """A key of another implementation is computed by JAX: the same bits as outside."""
    def kernel(o_ref):
        key = jax.random.fold_in(jax.random.key(3), pl.program_id(0))
        o_ref[...] = jax.random.bits(key, BLOCK)

    def threefry():
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((2 * BLOCK[0], BLOCK[1]), jnp.uint32),
            grid=(2,), out_specs=pl.BlockSpec(BLOCK, lambda i: (i, 0)))()

    (bits,) = _checked(check, threefry)
    want = np.concatenate([np.asarray(jax.random.bits(
        jax.random.fold_in(jax.random.key(3), i), BLOCK)) for i in range(2)])
    np.testing.assert_array_equal(bits, want)


def test_another_operation_on_keys_is_unsupported_with_its_name():
    def kernel(key_ref, o_ref):
        both = jnp.broadcast_to(key_ref[0, 0], (2,))
        o_ref[...] = jax.random.bits(both[1], BLOCK)

    def broadcast(key):
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct(BLOCK, jnp.uint32),
            in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)])(key)

    session = Session(Config())
    with pytest.raises(Exception), session.install():
        jax.block_until_ready(broadcast(_pallas_key(0)))
    assert ("does not support the primitive 'broadcast_in_dim' with typed PRNG keys"
            in (session.engine_error or "")), session.engine_error


def test_a_call_says_whether_it_drew_from_the_cores_prng(check, monkeypatch):
    """What `diff` and `replay` do not compare (the chip's bits are its own): the calls
    that drew bits from a core's PRNG, and only those. Seeding alone draws nothing, and
    a threefry key's bits are JAX's arithmetic, the chip's too."""
    drew = []
    handle_call = Session.handle_call

    def handle(self, *args, **kwargs):
        outputs = handle_call(self, *args, **kwargs)
        drew.append(self.last_call().drew_random)  # (the thread that ran the call)
        return outputs

    monkeypatch.setattr(Session, "handle_call", handle)

    def seed_only(seed_ref, o_ref):
        pltpu.prng_seed(seed_ref[0])
        o_ref[...] = jnp.zeros(BLOCK, jnp.float32) + seed_ref[0]

    def seeded():
        return pl.pallas_call(
            seed_only, out_shape=jax.ShapeDtypeStruct(BLOCK, jnp.float32),
            in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)])(jnp.array([3], jnp.int32))

    def threefry_kernel(o_ref):
        o_ref[...] = jax.random.bits(jax.random.key(3), BLOCK)

    def threefry():
        return pl.pallas_call(threefry_kernel,
                              out_shape=jax.ShapeDtypeStruct(BLOCK, jnp.uint32))()

    _checked(check, _stateful, 3)
    _checked(check, jax.jit(_sampled), _pallas_key(0))
    _checked(check, seeded)
    _checked(check, threefry)
    assert drew == [True, True, False, False]
