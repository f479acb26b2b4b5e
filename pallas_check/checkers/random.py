"""Random numbers a kernel misuses (the events of engine/rules/random.py and
engine/rules/conversions.py): a `random-misuse` finding each.

- One stream at several grid points: a core's PRNG seeded with the same values (or a
  key drawn from unchanged) at two grid points -- or on two cores -- of one device, and
  drawn from at both: every such grid step draws the same numbers (the kernel forgot
  `pl.program_id` in its seed). Reported at the second seeding, naming the first; a
  kernel that wants one stream everywhere suppresses it there.
- Stochastic rounding fed bits the chip does not read: the chip's rule looks only at the
  low 23 bits of each random word (`conversions.stochastic_round`); random bits put in the
  top bits (XLA's convention) leave some or all of those fixed, and the rounding biased
  or deterministic. Reported when the fixed bits are too many for uniform random words
  to show by chance (`conversions.LIKELY_WEIGHT`).
"""

from __future__ import annotations

from typing import NamedTuple

from pallas_check.checkers.base import Checker
from pallas_check.engine.events import CallFacts, FindingSink, GridPoint, Where
from pallas_check.engine.rules.conversions import LIKELY_WEIGHT, RandomBitsFixed
from pallas_check.engine.rules.random import StreamDrawn, StreamSeeded
from pallas_check.findings.finding import Finding, FindingKind

SEED_BUFFER = "PRNG seed"  # the finding's `buffer` for a stream seeded alike
BITS_BUFFER = "stochastic_round bits"  # ... for random words the rounding does not read
_SUPPRESS = "# pallas-check: ignore[random-misuse]"


class _Seeding(NamedTuple):
    where: Where
    stream: str
    seeds: tuple[int, ...]
    key: bool


class RandomChecker(Checker):
    """Pairs each draw with the seeding it draws from, per core and stream: only a
    seeding some draw consumed counts, so a seed set once and drawn from at later steps,
    or a seed no draw follows, is never compared."""

    def __init__(self, call: CallFacts, sink: FindingSink) -> None:
        super().__init__(call, sink)
        # Per (device, core, stream): its latest seeding no draw has consumed yet.
        self._pending: dict[tuple[int, int, str], _Seeding] = {}
        # Per (device, stream, seeds): the first seeding some draw consumed.
        self._drawn: dict[tuple[int, str, tuple[int, ...]], _Seeding] = {}

    def on_stream_seeded(self, event: StreamSeeded) -> None:
        where = event.where
        self._pending[(where.device, where.core, event.stream)] = _Seeding(
            where, event.stream, event.seeds, event.key)

    def on_stream_drawn(self, event: StreamDrawn) -> None:
        seeding = self._pending.pop((event.device, event.core, event.stream), None)
        if seeding is None:
            return  # unseeded, or a stream already drawn from: it goes on
        key = (event.device, seeding.stream, seeding.seeds)
        first = self._drawn.setdefault(key, seeding)
        if _place(first.where) != _place(seeding.where):
            self.sink.emit(self._reused(first, seeding))

    def _reused(self, first: _Seeding, again: _Seeding) -> Finding:
        where = again.where
        seeds = ", ".join(str(s) for s in again.seeds)
        if not again.key:
            what = f"the core's PRNG is seeded with the same values ({seeds})"
            fix = ("seed with the grid point too: pltpu.prng_seed(seed, pl.program_id(0),"
                   " ...) (each grid axis that should draw apart)")
        else:
            what = f"random bits are drawn from the same key (words {seeds})"
            fix = "fold the grid point into the key: jax.random.fold_in(key, pl.program_id(0))"
        cores = first.where.core != where.core
        lines = first.where.frames[:1] != where.frames[:1]
        message = (f"{what} at {_shown(first.where, cores, lines)} and at"
                   f" {_shown(where, cores, lines)}, and drawn from at both: both draw the same"
                   " random numbers")
        help_text = (f"{fix}; if one stream at every grid step is intended, put"
                     f" `{_SUPPRESS}` at the end of this line")
        return Finding(
            kind=FindingKind.RANDOM_MISUSE, message=message, kernel=self.call.kernel,
            call_index=self.call.call_index, grid_point=where.grid_point, actor=where.actor,
            buffer=SEED_BUFFER, frames=where.frames, help=help_text,
            details={"first_grid_point": _json_point(first.where.grid_point),
                     "first_core": first.where.core, "seeds": list(again.seeds)})

    def on_random_bits_fixed(self, event: RandomBitsFixed) -> None:
        if event.weight < LIKELY_WEIGHT:
            return  # as likely to come from uniform random words as not
        where = event.where
        bits = _bit_ranges(event.fixed)
        if event.none_random:
            said = (f"the random words' bits {bits} -- where the chip's rule reads them (only"
                    f" the low 23 bits of each word) -- are {event.ones:#x} in all"
                    f" {event.words} words whose rounding they decide: no randomness reaches"
                    " the rounding, each value rounds the same way every time")
            if event.ones == 0:
                said += " (away from zero)"
        else:
            said = (f"the random words' bits {bits} never vary over the {event.words} words"
                    " whose rounding they decide: the chip's rule reads only the low 23 bits of"
                    " each word, so the rounding draws from fewer random bits than it needs"
                    " and is biased")
        self.sink.emit(Finding(
            kind=FindingKind.RANDOM_MISUSE,
            message=f"pltpu.stochastic_round to {event.target}: {said}",
            kernel=self.call.kernel, call_index=self.call.call_index,
            grid_point=where.grid_point, actor=where.actor, buffer=BITS_BUFFER,
            frames=where.frames,
            help=("pass uniform uint32 words whole (jax.random.bits(key, shape, jnp.uint32),"
                  " pltpu.prng_random_bits), or put narrower random bits in the low 23 bits"
                  " (e.g. bits16.astype(jnp.uint32) << 7 for bfloat16), not in the top ones"),
            details={"fixed_bits": f"{event.fixed:#08x}", "words": event.words}))


def _place(where: Where) -> tuple[int, GridPoint]:
    return where.core, where.grid_point


def _shown(where: Where, core: bool, line: bool) -> str:
    """`grid point (1,)`, with its core and line where the two seedings differ in them."""
    point = "grid point " + str(where.grid_point) if where.grid_point is not None else ""
    if core:
        point = f"{point} of core {where.core}" if point else f"core {where.core}"
    if line and where.frames:
        point += f" (line {where.frames[0].line})"
    return point


def _json_point(point: GridPoint) -> list[int] | None:
    return list(point) if point is not None else None


def _bit_ranges(mask: int) -> str:
    """`7-15, 20` for the set bits of `mask`."""
    runs: list[list[int]] = []
    for bit in range(23):
        if mask >> bit & 1:
            if runs and runs[-1][1] == bit - 1:
                runs[-1][1] = bit
            else:
                runs.append([bit, bit])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
