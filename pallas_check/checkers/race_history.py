"""One buffer's live access records for the race checker (races.py), indexed so that a new
access visits only the records it may overlap.

Pruning keeps only what is not covered by a newer ordered access, but accesses to disjoint
parts of a buffer (one block per grid step, one slice per DMA, one (L,)-vector per
SparseCore load) all stay live, and visiting each of them at every new access would make
the cost per access grow with the run. So beyond a few records they are also indexed in
buckets along one dimension, or two (the ones where they differ most, buckets as wide as
a typical access): a new access visits only the records in the buckets it touches, plus
the few that span many buckets. Records that do not overlap an access can neither race
with it nor be pruned by it, so visiting this superset, in the same order, changes no
result.

Before that, while a buffer's records have had few distinct ranges (16 at most: a
double-buffered VMEM scratch's slots and pages, a few blocks), they are kept by range
instead, with, per range met, the ranges met that overlap it (computed once, when a
range is first met): an access visits the records of those ranges alone, exactly the
records it overlaps, with no bucket to compute (issue 55.4: paged attention's K/V
buffers hold two slots of two pages and a core's read of each slot; every DMA landing
visited all six records, now the two it overlaps). The walk of an access (`check`, the
race checker's, here where the records are) visits them range by range: what it does
with a record depends on that record and the access alone, and the races it finds are
reported in the order the records were made. Beyond 16 ranges the history is indexed as
below, for good.

The index is built once a history holds more than 8 records (issue 55.4: paged
attention's HBM pages, read by one DMA each, stayed unindexed and were all visited by
every DMA until 32), and chosen again when the history has doubled if the lookups since
visited too many. While every record is of one element (scalar loads and stores of an SMEM
table: a page table, sequence lengths, a flag), the history is kept by element instead:
an access to one element visits that element's records alone, with no index to compute.
Two one-element boxes overlap only where they are equal, so that visits exactly the
records it overlaps. The first access of more than one element turns the history into
records of any range, kept by range or indexed as above, for good.

Two dimensions when one is not enough (issue 54.7): a SparseCore kernel reading a VMEM
chunk as (L,)-vectors, `rows_v[slot, row, pl.ds(c * L, L)]`, leaves one record per row and
column chunk; indexed by row alone, each read visited every column chunk of its row (21
records on average in a weighted gather-reduce); by row and column, the one or two it may
overlap. Which to use is decided when the index is built, by what each would cost on the
records then live: the second dimension only when it visits fewer.
"""

from __future__ import annotations

from typing import Callable, Iterable, NamedTuple, ValuesView

from pallas_check.findings.finding import Access, IndexRange, SourceFrame


def _overlap(a: IndexRange, b: IndexRange) -> IndexRange | None:
    """The elements two non-empty boxes share (None: none). Most unordered pairs the
    checker compares share none (DMAs in flight into other slots): that is found first,
    without building anything."""
    if len(a) != len(b):
        return None
    for (alo, ahi), (blo, bhi) in zip(a, b):
        if alo >= bhi or blo >= ahi:
            return None
    return tuple([(alo if alo > blo else blo, ahi if ahi < bhi else bhi)
                  for (alo, ahi), (blo, bhi) in zip(a, b)])


def _covers(outer: IndexRange, inner: IndexRange) -> bool:
    # (plain loops, not all()/any() over a generator: these run for every pair of
    # accesses the race checker compares)
    if len(outer) != len(inner):
        return False
    for (olo, ohi), (ilo, ihi) in zip(outer, inner):
        if ilo < olo or ohi < ihi:
            return False
    return True


def _meets(a: IndexRange, b: IndexRange) -> bool:
    """Whether two non-empty boxes share an element."""
    if len(a) != len(b):
        return False
    for (alo, ahi), (blo, bhi) in zip(a, b):
        if alo >= bhi or blo >= ahi:
            return False
    return True


class AccessRecord(NamedTuple):
    """An access as the history keeps it (a NamedTuple: one is made per access)."""

    actor: str
    epoch: int
    index_range: IndexRange
    is_write: bool
    operation: str
    buffer: str
    memory_space: str
    frames: tuple[SourceFrame, ...]
    grid_point: tuple[int, ...] | None
    slot: str = ""  # the clock entry `epoch` belongs to (the actor's, or a reused DMA slot)
    atomic_add: bool = False  # an atomic read-modify-write add (never races with another)

    def as_access(self, index_range: IndexRange | None = None) -> Access:
        return Access(self.operation, self.actor, self.buffer, self.memory_space,
                      index_range if index_range is not None else self.index_range,
                      self.frames, self.grid_point)


SWEEP_AFTER = 64  # history length of a buffer that triggers its first frontier sweep
_STRIDE = 1 << 40  # a bucket's key: its index along the first dimension * _STRIDE + the second's


class History:
    """One buffer's live access records, in the order they were made, and their buckets."""

    __slots__ = ("records", "seq", "dims", "widths", "buckets", "wide", "index_at",
                 "longest", "queries", "visits", "last", "last_clock", "last_joins", "memo",
                 "cells", "sweep_at", "groups", "near")
    INDEX_AFTER = 8
    GROUPS = 16  # the most distinct ranges a history is kept by range for (`groups`)
    WIDE = 8  # a record spanning more buckets is kept in `wide` (always visited)
    SAMPLE = 128  # the most recent records the choice of dimensions is costed on

    def __init__(self) -> None:
        self.records: dict[int, AccessRecord] = {}  # insertion order
        self.seq = 0
        # The indexed dimensions (none: not indexed yet; with one, the second is -1) and
        # a bucket's width along each.
        self.dims: tuple[int, int] | None = None
        self.widths = (1, 1)
        # Per bucket its records' seqs, in the order they were made (as `records`).
        self.buckets: dict[int, dict[int, None]] = {}
        self.wide: dict[int, None] = {}
        self.index_at = self.INDEX_AFTER  # (re)index once there are more records than this
        self.longest = 0  # the most records held at once (CallSummary.races)
        # Since the index was built: the accesses looked up, and the records they visited
        # (an index that serves well is kept as the history grows, not built again).
        self.queries = 0
        self.visits = 0
        # The newest record while it is live and its access met no race, with its actor's
        # clock and the race checker's join count then (races.py: what a repeat skips).
        self.last: AccessRecord | None = None
        self.last_clock: object = None
        self.last_joins = 0
        # The range `_span` was last asked for, and its answer (no range: nothing yet).
        self.memo: tuple[IndexRange | None, tuple[int, int, int, int] | None] = (None, None)
        # While every record is of one element (scalar loads and stores: an SMEM table's),
        # per element its records' seqs in order (None: the records are of any range,
        # indexed as above).
        self.cells: dict[IndexRange, dict[int, None]] | None = {}
        # Then, while the records have had few distinct ranges (GROUPS at most), per range
        # met its live records by seq (`groups`), and per range the groups of every range
        # met that overlaps it, its own first (`near`); None: indexed as above, for good.
        self.groups: dict[IndexRange, dict[int, AccessRecord]] | None = {}
        self.near: dict[IndexRange, list[dict[int, AccessRecord]]] = {}
        # The race checker sweeps this history once it holds more records than this
        # (races.py `_sweep`, which sets it again).
        self.sweep_at = SWEEP_AFTER

    def __len__(self) -> int:
        return len(self.records)

    def values(self) -> ValuesView[AccessRecord]:
        return self.records.values()

    def _span(self, rng: IndexRange) -> tuple[int, int, int, int] | None:
        """The first and last bucket `rng` touches along each indexed dimension (0, 0
        along an unused second; None: `rng` lacks one of them, a record of another
        rank). The last range's is kept: an access looks its range up, then prunes
        records of the same range and adds its own."""
        if rng == self.memo[0]:
            return self.memo[1]
        d0, d1 = self.dims  # type: ignore[misc]  # (only called once indexed)
        w0, w1 = self.widths
        if len(rng) <= d0 or len(rng) <= d1:
            span = None
        else:
            lo, hi = rng[d0]
            if d1 < 0:
                span = lo // w0, (hi - 1) // w0, 0, 0
            else:
                lo1, hi1 = rng[d1]
                span = lo // w0, (hi - 1) // w0, lo1 // w1, (hi1 - 1) // w1
        self.memo = (rng, span)
        return span

    def check(self, record: AccessRecord, element: bool, seen: Callable[[str, int], int]
              ) -> list[tuple[int, AccessRecord, IndexRange]] | None:
        """The race checker's walk (races.py `on_access`) of a new access, `record`, made
        here, where the records are: each record it may overlap is visited; one it is
        not ordered after (`seen`: its actor's clock, slot -> epoch) races with it where
        they overlap if either writes (two atomic adds never race); one it is ordered
        after and covers, with it a write or that one a read, is dropped (pruned: a later
        race with that one is one with this). Then it is kept. Returns the races (seq,
        record, the elements shared), in the order the records were made; None: none.
        Each record's outcome depends on it and `record` alone, so the records by range
        are visited range by range, and the drops made after the walk."""
        actor, _, rng, is_write, _, _, _, _, _, _, atomic_add = record
        near = None
        if self.cells is None and self.groups is not None:
            near = self.near.get(rng)
            if near is None:
                near = self._meet(rng)
        visits: Iterable[tuple[int, AccessRecord]]
        if near is None:
            visits = self.candidates(rng, element)
        elif len(near) == 1:
            visits = near[0].items()
        else:
            visits = []
            for group in near:
                if group:
                    visits += group.items()
        races = dead = None
        for seq, prev in visits:
            p_actor, p_epoch, p_range, p_write, _, _, _, _, _, p_slot, p_add = prev
            if p_actor == actor or p_epoch <= seen(p_slot, 0):  # ordered (has_seen)
                # (an atomic add covers only atomic adds: a later add races with a plain
                # write it would hide)
                if (is_write or not p_write) and (not atomic_add or p_add) and (
                        p_range == rng or _covers(rng, p_range)):
                    if dead is None:
                        dead = [seq]
                    else:
                        dead.append(seq)
            elif (p_write or is_write) and not (atomic_add and p_add):
                overlap = _overlap(p_range, rng)
                if overlap is not None:
                    if races is None:
                        races = [(seq, prev, overlap)]
                    else:
                        races.append((seq, prev, overlap))
        if dead is not None:
            for seq in dead:
                self.remove(seq)
        if near is None or self.groups is None:
            self.add(record, element)
        else:  # (`add`, by range, inlined)
            self.last = None
            self.seq = seq = self.seq + 1
            self.records[seq] = near[0][seq] = record
            if len(self.records) > self.longest:
                self.longest = len(self.records)
        if races is not None and len(races) > 1:
            races.sort()  # (by seq: no two records share one)
        return races

    def candidates(self, rng: IndexRange,
                   element: bool = False) -> list[tuple[int, AccessRecord]]:
        """(seq, record) of every record `rng` may overlap, in the order they were made
        (`element`: `rng` is one element)."""
        records = self.records
        cells = self.cells
        if cells is not None:
            if element:  # its own element's records: no other overlaps it
                found = cells.get(rng)
                return [(s, records[s]) for s in found] if found else []
            self._index()  # (an access of more than one element: the records indexed)
        groups = self.groups
        if groups is not None:
            near = self.near.get(rng)
            if near is None:
                near = self._meet(rng)
            if near is not None:
                if len(near) == 1:  # (only its own range: in order already)
                    return list(near[0].items())
                out: list[tuple[int, AccessRecord]] = []
                for group in near:
                    if group:
                        out += group.items()
                out.sort()  # (by seq: no two records share one)
                return out
        span = self._span(rng) if self.dims is not None else None
        if span is None:
            return list(records.items())
        f0, l0, f1, l1 = span
        buckets = self.buckets
        self.queries += 1
        if f0 == l0 and f1 == l1:  # (the commonest: one bucket)
            found = buckets.get(f0 * _STRIDE + f1)
            if not self.wide:  # (a bucket holds its seqs in order)
                out = [(s, records[s]) for s in found] if found else []
                self.visits += len(out)
                return out
            seqs = set(self.wide)
            if found:
                seqs.update(found)
        else:
            seqs = set(self.wide)
            if (l0 - f0 + 1) * (l1 - f1 + 1) >= len(buckets):
                for bucket in buckets.values():
                    seqs.update(bucket)
            else:
                for k0 in range(f0, l0 + 1):
                    for k1 in range(f1, l1 + 1):
                        found = buckets.get(k0 * _STRIDE + k1)
                        if found:
                            seqs.update(found)
        self.visits += len(seqs)
        return [(s, records[s]) for s in sorted(seqs)]

    def _index(self) -> None:
        """From records by element to records of any range (for good: the buffer is
        accessed otherwise too): by range while there are few, else indexed as above."""
        self.cells = None
        groups = self.groups
        assert groups is not None
        for seq, record in self.records.items():
            found = groups.get(record[2])
            if found is None:
                if self._meet(record[2]) is None:
                    return  # (too many ranges: indexed by `_ungroup`)
                found = groups[record[2]]
            found[seq] = record

    def _meet(self, rng: IndexRange) -> list[dict[int, AccessRecord]] | None:
        """A range not met before: its group, and the groups of the ranges met so far that
        it overlaps (None: there are too many to keep the records by range, `_ungroup`)."""
        groups = self.groups
        assert groups is not None
        if len(groups) >= self.GROUPS:
            self._ungroup()
            return None
        found: dict[int, AccessRecord] = {}
        mine = [found]
        near = self.near
        for other, theirs in near.items():
            if _meets(other, rng):
                mine.append(groups[other])
                theirs.append(found)
        groups[rng] = found
        near[rng] = mine
        return mine

    def _ungroup(self) -> None:
        """Many distinct ranges (one block per grid step, a SparseCore row each): the
        records indexed as above from now on."""
        self.groups = None
        self.near = {}
        if len(self.records) > self.INDEX_AFTER:
            self.index_at = 2 * len(self.records)
            self._build()

    def add(self, record: AccessRecord, element: bool = False) -> None:
        """Keep `record`, the newest (`element`: its range is one element)."""
        self.last = None
        self.seq = seq = self.seq + 1
        records = self.records
        cells = self.cells
        if cells is not None:
            if element:
                records[seq] = record
                cell = cells.get(record[2])
                if cell is None:
                    cells[record[2]] = {seq: None}
                else:
                    cell[seq] = None
                if len(records) > self.longest:
                    self.longest = len(records)
                return
            self._index()
        records[seq] = record
        groups = self.groups
        if groups is not None:
            found = groups.get(record[2])
            if found is None and self._meet(record[2]) is not None:
                found = groups[record[2]]
            if found is not None:  # (else left for an index by `_meet`)
                found[seq] = record
                if len(records) > self.longest:
                    self.longest = len(records)
                return
        if self.dims is not None:
            self._place(seq, record)
        size = len(records)
        if size > self.longest:
            self.longest = size
        if size > self.index_at:
            self.index_at = max(self.INDEX_AFTER, 2 * size)
            if self.dims is None or self.visits > self.WIDE * self.queries:
                self._build()

    def repeat(self, record: AccessRecord) -> None:
        """`record` replaces `last`, the newest record, of the same box: what removing
        that one and adding this one would leave (the same records, in the same order,
        in the same buckets), without the work."""
        self.records[self.seq] = self.last = record
        if self.cells is None and self.groups is not None:  # (by range: kept there too)
            self.groups[record[2]][self.seq] = record

    def remove(self, seq: int) -> None:
        if seq == self.seq:
            self.last = None
        record = self.records.pop(seq)
        cells = self.cells
        if cells is not None:
            cell = cells[record[2]]
            del cell[seq]
            if not cell:
                del cells[record[2]]
            return
        groups = self.groups
        if groups is not None:  # (a range's group stays, empty, while it is met)
            del groups[record[2]][seq]
            return
        if self.dims is None:
            return
        if seq in self.wide:
            del self.wide[seq]
            return
        span = self._span(record.index_range)
        assert span is not None  # (else it would be wide)
        buckets = self.buckets
        f0, l0, f1, l1 = span
        for k0 in range(f0, l0 + 1):
            for k1 in range(f1, l1 + 1):
                key = k0 * _STRIDE + k1
                bucket = buckets[key]
                del bucket[seq]
                if not bucket:
                    del buckets[key]

    def _place(self, seq: int, record: AccessRecord) -> None:
        span = self._span(record.index_range)
        if span is None:
            self.wide[seq] = None
            return
        f0, l0, f1, l1 = span
        if (l0 - f0 + 1) * (l1 - f1 + 1) > self.WIDE:
            self.wide[seq] = None
            return
        buckets = self.buckets
        for k0 in range(f0, l0 + 1):
            for k1 in range(f1, l1 + 1):
                key = k0 * _STRIDE + k1
                bucket = buckets.get(key)
                if bucket is None:
                    buckets[key] = {seq: None}
                else:
                    bucket[seq] = None

    def _build(self) -> None:
        """(Re)index along the dimension where the live records differ most, or along it
        and the next one when that visits fewer records (`_cost`)."""
        self.queries = self.visits = 0
        self.memo = (None, None)  # (spans change with the dimensions and widths)
        ranges = [r.index_range for r in self.records.values()]
        rank = min(len(r) for r in ranges)
        if rank == 0:
            return  # scalars: nothing to index by; try again when the history doubles
        distinct = {d: len({r[d] for r in ranges}) for d in range(rank)}
        order = sorted(range(rank), key=lambda d: (-distinct[d], d))
        widths = {}
        for d in order[:2]:
            extents = sorted(r[d][1] - r[d][0] for r in ranges)
            widths[d] = max(1, extents[len(extents) // 2])
        self.dims, self.widths = (order[0], -1), (widths[order[0]], 1)
        if rank > 1 and distinct[order[1]] > 1:
            sample = ranges[-self.SAMPLE:]
            one = self._cost(sample)
            self.dims, self.widths = (order[0], order[1]), (widths[order[0]], widths[order[1]])
            if self._cost(sample) >= one:
                self.dims, self.widths = (order[0], -1), (widths[order[0]], 1)
        self.buckets, self.wide, self.memo = {}, {}, (None, None)
        for seq, record in self.records.items():
            self._place(seq, record)

    def _cost(self, ranges: list[IndexRange]) -> int:
        """About how many records `ranges` would visit, each queried once, under the
        current `dims` and `widths`: the sizes of the buckets each touches, plus the wide
        records, which everyone visits (and which visit everything)."""
        self.memo = (None, None)  # (under the dimensions being costed)
        counts: dict[int, int] = {}
        wide = 0
        placed: list[list[int]] = []
        for rng in ranges:
            span = self._span(rng)
            if span is None or (span[1] - span[0] + 1) * (span[3] - span[2] + 1) > self.WIDE:
                wide += 1
                continue
            keys = [k0 * _STRIDE + k1 for k0 in range(span[0], span[1] + 1)
                    for k1 in range(span[2], span[3] + 1)]
            placed.append(keys)
            for key in keys:
                counts[key] = counts.get(key, 0) + 1
        cost = wide * len(ranges) + wide * len(placed)
        for keys in placed:
            cost += sum(counts[key] for key in keys)
        return cost
