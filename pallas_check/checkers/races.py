"""Race detection: happens-before with vector clocks, one clock per actor.

Actors are cores and DMAs (each DMA is its own actor, whose clock starts as its starter's
clock at the start). Edges: program order; DMA start -> the DMA's read and write;
the DMA -> its semaphores; semaphore signal -> the wait that consumes it; barriers.
No clock slot is shared, so a DMA-DMA race is never hidden.

Per buffer only the accesses not yet ordered before a newer, covering access are kept
(FastTrack-style pruning): an access P ordered before a new access N whose range covers
P's, with N a write or P a read, can only race with later accesses that would race with N
too — so P is dropped and the cost per access stays near constant as a kernel runs on.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from pallas_check.findings import Access, Finding, FindingKind, IndexRange, SourceFrame, format_range

Clock = dict[str, int]


@dataclasses.dataclass(frozen=True)
class AccessRecord:
    actor: str
    epoch: int
    index_range: IndexRange
    is_write: bool
    operation: str
    buffer: str
    memory_space: str
    frames: tuple[SourceFrame, ...]
    grid_point: tuple[int, ...] | None

    def as_access(self, index_range: IndexRange | None = None) -> Access:
        return Access(self.operation, self.actor, self.buffer, self.memory_space,
                      index_range if index_range is not None else self.index_range,
                      self.frames, self.grid_point)


def _overlap(a: IndexRange, b: IndexRange) -> IndexRange | None:
    if len(a) != len(b):
        return None
    out = []
    for (alo, ahi), (blo, bhi) in zip(a, b):
        lo, hi = max(alo, blo), min(ahi, bhi)
        if lo >= hi:
            return None
        out.append((lo, hi))
    return tuple(out)


def _covers(outer: IndexRange, inner: IndexRange) -> bool:
    return len(outer) == len(inner) and all(
        olo <= ilo and ihi <= ohi for (olo, ohi), (ilo, ihi) in zip(outer, inner))


class RaceChecker:
    """Collects races of one pallas_call; `report` receives each as a Finding."""

    def __init__(self, make_finding: Callable[..., Finding], report: Callable[[Finding], None]):
        self._make_finding = make_finding
        self._report = report
        self.clocks: dict[str, Clock] = {}
        self.sync_clocks: dict[Any, Clock] = {}
        self.history: dict[int, list[AccessRecord]] = {}
        self.checked = 0  # accesses checked (for benchmarks)

    # -- clocks ------------------------------------------------------------------------
    def clock(self, actor: str) -> Clock:
        vc = self.clocks.get(actor)
        if vc is None:
            vc = self.clocks[actor] = {actor: 1}
        return vc

    def _tick(self, actor: str) -> None:
        vc = self.clock(actor)
        vc[actor] = vc.get(actor, 0) + 1

    @staticmethod
    def _join(into: Clock, other: Clock) -> None:
        for actor, t in other.items():
            if into.get(actor, 0) < t:
                into[actor] = t

    def fork(self, parent: str, child: str) -> None:
        """`child` (a DMA) starts now: everything `parent` did so far happens before it."""
        vc = dict(self.clock(parent))
        vc[child] = 1
        self.clocks[child] = vc
        self._tick(parent)

    def release(self, actor: str, sync_object: Any) -> None:
        """`actor` signals `sync_object` (a semaphore cell, a barrier)."""
        self._join(self.sync_clocks.setdefault(sync_object, {}), self.clock(actor))
        self._tick(actor)

    def acquire(self, actor: str, sync_object: Any) -> None:
        """`actor` waited on `sync_object`: what was released to it happens before now."""
        released = self.sync_clocks.get(sync_object)
        if released:
            self._join(self.clock(actor), released)

    # -- accesses ----------------------------------------------------------------------
    def access(self, actor: str, buffer: Any, index_range: IndexRange, is_write: bool,
               operation: str, frames: tuple[SourceFrame, ...],
               grid_point: tuple[int, ...] | None) -> None:
        self.checked += 1
        vc = self.clock(actor)
        record = AccessRecord(actor, vc[actor], index_range, is_write, operation, buffer.name,
                              buffer.space, frames, grid_point)
        kept: list[AccessRecord] = []
        for prev in self.history.get(buffer.id, ()):
            ordered = prev.actor == actor or prev.epoch <= vc.get(prev.actor, 0)
            if not ordered and (prev.is_write or is_write):
                overlap = _overlap(prev.index_range, index_range)
                if overlap is not None:
                    self._race(record, prev, overlap)
            if ordered and (is_write or not prev.is_write) and _covers(index_range,
                                                                       prev.index_range):
                continue  # pruned: any later race with prev is a race with this access
            kept.append(prev)
        kept.append(record)
        self.history[buffer.id] = kept

    def _race(self, current: AccessRecord, previous: AccessRecord, overlap: IndexRange) -> None:
        where = format_range(overlap)
        message = (f"{current.operation} of {current.buffer}{where} by {current.actor} races"
                   f" with {previous.operation} by {previous.actor}: no semaphore, DMA wait or"
                   f" barrier orders them")
        self._report(self._make_finding(
            kind=FindingKind.RACE, message=message, buffer=current.buffer,
            memory_space=current.memory_space, index_range=overlap, frames=current.frames,
            actor=current.actor, grid_point=current.grid_point,
            accesses=(current.as_access(overlap), previous.as_access(overlap)),
        ))
