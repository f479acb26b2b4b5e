"""Rules for random numbers in a kernel: the core's hardware PRNG (`pltpu.prng_seed`,
`pltpu.prng_random_bits`), the stateful samplers built on it (`pltpu.stateful_uniform`,
`stateful_normal`, `stateful_bernoulli`, `stateful_bits`: `jax.random` on a placeholder
key whose bits are the hardware PRNG's), and typed keys (`pltpu.to_pallas_key`,
`pltpu.sample_block`: `random_fold_in` and `random_bits` on a `key<pl>`).

Each core has a generator of its own, seeded from its device and core until the kernel
seeds it; `prng_seed(*seeds)` reseeds it from exactly those seeds, so the bits drawn are
a function of the seeds and the draws since (the same seed gives the same bits, at any
grid point; seeding with the grid point, as kernels do, gives each point its own
stream). They are not the chip's bits: the chip's generator is its own (docs/limitations.md).
The floats are what JAX derives from the bits, as on a chip: `uniform` from the top 23
bits as a mantissa, `normal` from `uniform` by the inverse error function, `bernoulli`
as `uniform < p` -- those equations stay in the kernel's jaxpr and run as written.

A key of the Pallas TPU implementation (`pallas_tpu`, two words) seeds the hardware PRNG
when its bits are drawn, as the chip's lowering does (it replaces the core's state), and
folds data in by one threefry round, as JAX's `fold_in` for it does. A key of any other
implementation is computed by JAX (jaxbridge/keys.py).

For checkers/random.py the rules tell who seeds a stream and who draws from it: a
`StreamSeeded` at each `prng_seed` (its seed values) and each draw from a key (the key's
words: a Pallas key seeds the core's PRNG with them; another key is a stream of its own),
and a `StreamDrawn` at each draw, so that a stream seeded alike at two grid points and
drawn from at both is found (every grid step then draws the same numbers).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pallas_check.jaxbridge import keys
from pallas_check.jaxbridge import params as eqn_params
from pallas_check.jaxbridge.primitives import (prng_join_p, prng_random_bits_p, prng_seed_p,
                                               prng_split_p, random_bits_p, random_fold_in_p,
                                               random_seed_p, random_unwrap_p, random_wrap_p)
from pallas_check.jaxbridge.types import JaxprEqn
from pallas_check.engine.events import event_kind
from pallas_check.engine.verdicts import GridPoint, Where
from pallas_check.engine.jaxpr.halts import KernelError
from pallas_check.engine.jaxpr.program import current_frames
from pallas_check.engine.jaxpr.registry import rule
from pallas_check.engine.seam import RunningCore

_MASK = 0xFFFFFFFF
CORE_PRNG = "the core's PRNG"  # a `StreamSeeded`'s `stream`: prng_seed, a Pallas key
JAX_KEY = "a JAX key"  # a key of another implementation: bits JAX computes from it


@event_kind
class StreamSeeded(NamedTuple):
    """`where.actor`'s core seeded a random stream: its PRNG by `pltpu.prng_seed(*seeds)`
    or by drawing from a Pallas key (its words), or drew from a key JAX computes the bits
    of (`stream` says which PRNG; `seeds`: the seed values or the key's words; `key`:
    seeded by drawing from a key)."""

    where: Where
    stream: str
    seeds: tuple[int, ...]
    key: bool


@event_kind
class StreamDrawn(NamedTuple):
    """A core drew from the stream of `stream` it seeded last (`prng_random_bits`, a
    `stateful_*` sampler, bits of a key)."""

    device: int
    core: int
    grid_point: GridPoint
    stream: str


def _seeded(ctx: RunningCore, stream: str, seeds: list[int], key: bool) -> None:
    if ctx.call.feeds.takes(StreamSeeded):
        where = Where(ctx.actor, ctx.device_id, ctx.core_id, ctx.grid_point,
                      current_frames(ctx))
        ctx.call.tell(StreamSeeded(where, stream, tuple(s & _MASK for s in seeds), key))


def _drawn(ctx: RunningCore, stream: str = CORE_PRNG) -> None:
    if ctx.call.feeds.takes(StreamDrawn):
        ctx.call.tell(StreamDrawn(ctx.device_id, ctx.core_id, ctx.grid_point, stream))


def _reseed(ctx: RunningCore, seeds: list[int]) -> None:
    ctx.rng = np.random.default_rng([s & _MASK for s in seeds] or [0])


def _draw(ctx: RunningCore, shape: tuple[int, ...]) -> np.ndarray:
    """`shape` uint32 bits from the core's generator (the call's `drew_random` set: they
    are not the chip's bits)."""
    ctx.call.drew_random = True
    return ctx.rng.integers(0, 2**32, size=shape, dtype=np.uint64).astype(np.uint32)


def _ints(values: list[object]) -> list[int]:
    out: list[int] = []
    for value in values:
        out.extend(int(v) for v in np.asarray(value).astype(np.int64).reshape(-1))
    return out


# -- the hardware PRNG -----------------------------------------------------------------

@rule(prng_seed_p)
def _prng_seed(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> object:
    # A key loaded from SMEM seeds with its words, as Mosaic's lowering does.
    seeds = _ints([keys.words(v) if _is_key(eqn, k) else v for k, v in enumerate(invals)])
    _reseed(ctx, seeds)
    _seeded(ctx, CORE_PRNG, seeds, key=False)
    return []


@rule(prng_random_bits_p)
def _prng_random_bits(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> object:
    _drawn(ctx)
    return _draw(ctx, tuple(eqn_params.result_shape(eqn))).view(np.int32)


def _is_key(eqn: JaxprEqn, k: int) -> bool:
    return keys.is_key_aval(getattr(eqn.invars[k], "aval", None))


def _key_dtype(eqn: JaxprEqn) -> object:
    return eqn.invars[0].aval.dtype  # type: ignore[attr-defined]


# -- typed keys --------------------------------------------------------------------------

@rule(random_seed_p)
def _random_seed(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> object:
    dtype = eqn.outvars[0].aval.dtype  # type: ignore[attr-defined]
    seeds = np.asarray(invals[0])
    name = keys.impl_name(dtype)
    if name == keys.STATEFUL:  # a placeholder: its bits are the core's PRNG's
        return keys.from_words(np.zeros(seeds.shape, np.uint32), dtype)
    if name == keys.PALLAS_TPU:  # every word the seed (JAX's `_seed_func`)
        shape = seeds.shape + keys.key_shape(dtype)
        data = np.broadcast_to(seeds.astype(np.int64)[..., None, None] & _MASK, shape)
        return keys.from_words(data.astype(np.uint32), dtype)
    return keys.jax_seed(seeds, dtype)


@rule(random_bits_p)
def _random_bits(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> object:
    dtype = _key_dtype(eqn)
    shape = eqn_params.result_shape(eqn)
    bit_width = eqn_params.bit_width(eqn)
    name = keys.impl_name(dtype)
    if name not in (keys.STATEFUL, keys.PALLAS_TPU):
        _seeded(ctx, JAX_KEY, _ints([keys.words(invals[0])]), key=True)
        _drawn(ctx, JAX_KEY)
        return keys.jax_bits(np.asarray(invals[0]), dtype, bit_width, shape)
    if bit_width != 32:
        raise KernelError(f"the TPU's PRNG draws 32-bit words, not {bit_width}-bit ones")
    if name == keys.PALLAS_TPU:
        words = keys.words(invals[0])
        if words.ndim != 2:
            raise KernelError("random bits of a Pallas key are drawn one key at a time")
        _reseed(ctx, _ints([words]))  # the key seeds the core's PRNG, as on the chip
        _seeded(ctx, CORE_PRNG, _ints([words]), key=True)
    _drawn(ctx)
    return _draw(ctx, shape)


def _fold_round(key0: np.ndarray, key1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One threefry round (rotation 13) on uint32 words, JAX's `fold_in` for a Pallas key."""
    with np.errstate(over="ignore"):
        key0 = (key0 + key1).astype(np.uint32)
    key1 = (key1 << np.uint32(13)) | (key1 >> np.uint32(19))
    return key0, key0 ^ key1


@rule(random_fold_in_p)
def _random_fold_in(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> object:
    dtype = _key_dtype(eqn)
    data = np.asarray(invals[1])
    name = keys.impl_name(dtype)
    if name == keys.STATEFUL:
        raise KernelError("a stateful sampler's placeholder key cannot be folded into")
    if name != keys.PALLAS_TPU:
        return keys.jax_fold_in(np.asarray(invals[0]), data, dtype)
    words = keys.words(invals[0])
    with np.errstate(over="ignore"):
        key1 = (words[..., 1] + data.astype(np.uint32)).astype(np.uint32)
    key0, key1 = _fold_round(words[..., 0], key1)
    return keys.from_words(np.stack([key0, key1], axis=-1), dtype)


@rule(random_wrap_p)
def _random_wrap(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> object:
    return keys.from_words(np.asarray(invals[0]), eqn.outvars[0].aval.dtype)  # type: ignore[attr-defined]


@rule(random_unwrap_p)
def _random_unwrap(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> object:
    return keys.words(invals[0]).copy()


@rule(prng_split_p)
def _prng_split(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> object:
    words = keys.words(invals[0]).reshape(-1)
    return [np.uint32(w) for w in words]


@rule(prng_join_p)
def _prng_join(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> object:
    dtype = eqn.outvars[0].aval.dtype  # type: ignore[attr-defined]
    words = np.array([int(np.asarray(v).astype(np.int64)) & _MASK for v in invals], np.uint32)
    return keys.from_words(words.reshape(keys.key_shape(dtype)), dtype)
