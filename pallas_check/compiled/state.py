"""The state a compiled call carries through its computation, as one tracing pass sees it.

Everything the engine keeps as Python objects is here an array that XLA carries through
the grid loop and every loop of the kernel: each buffer's value and, where something can
leave it unwritten, its written-shadow (a bool per element); the semaphores as one int32
vector of counts; the DMAs in flight as a fixed-size table (table.py); the verdict bits.

A state is the machine at one point of tracing. Control flow hands its arrays over as a
pytree (`carry`) and takes them back (`restore`), so a `lax.while_loop` or `lax.switch`
carries the whole memory the way the engine's Python carries it. Buffers are numbered as
they are made (the call's operands and scratch, then each `pl.run_scoped` allocation while
its scope lasts), the same way in every tracing pass.

What the trace itself knows is kept beside the arrays: the DMAs started in the stretch of
straight-line code being traced (`Started`). Such a DMA is written into the table only
when something reads the table (a race check, a wait that searches it, control flow, the
end); a wait on its own cell first takes it as it is (dma.py), so a DMA started and waited
in one stretch never costs the table anything.

The trace also knows when the table holds no DMA (`maybe_active` false: nothing was
written into it on any path to this point). A race check then compares an access with the
stretch's own DMAs, box against box, and reads no table: a kernel whose DMAs are all
started and waited in one stretch (or that has none) pays nothing for the table with races
on. A loop's body is traced knowing what the table held before the loop; a body that
writes rows is traced again, not knowing (the next trip sees what this one left).
What race checking covered is counted at trace time where it can be and added to the
traced `coverage` once a stretch ends.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence, TypeVar

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax

from pallas_check.compiled.boxes import (MAX_RANK, Index, all_set, any_of, boxes_meet, either,
                                          i32, meets, outside, padded, plus, put, take, times)
from pallas_check.compiled.refs import BufferInfo, Carry, Ref, SemInfo, Unsupported
from pallas_check.compiled.table import DmaSite, Table
from pallas_check.compiled.verdict import Verdict

_Traced = TypeVar("_Traced")


@dataclasses.dataclass(frozen=True)
class Started:
    """A DMA started in the stretch of straight-line code being traced and not waited
    since, the newest on its semaphore cell (`sem`, `sem_starts`, as traced). `slot`:
    where it is in the table, None while it is not written there."""

    sem: int
    sem_starts: tuple[Index, ...]
    cell: jax.Array
    site_id: int
    site: DmaSite
    src: Ref
    dst: Ref
    landed: bool  # eager: it landed when it started (its count waits for its row)
    slot: jax.Array | None = None

    def waited_by(self, sem: Ref) -> bool:
        """Whether `sem` is the same cell, as traced (the same values, or equal ints)."""
        return sem.buffer == self.sem and all(
            a is b or (isinstance(a, (int, np.integer)) and isinstance(b, (int, np.integer))
                       and int(a) == int(b)) for a, b in zip(sem.starts, self.sem_starts))

    def row(self, clock: jax.Array) -> list[Index]:
        """Its row of the table (table.py's columns), a value per column: ints where the
        trace knows them (`Table.started` makes one constant of those)."""
        def pad(values: Sequence[Index], fill: int) -> list[Index]:
            return list(values) + [fill] * (MAX_RANK - len(values))

        return [1, int(self.landed), self.site_id, clock, self.cell, self.site.nbytes,
                self.src.buffer, self.dst.buffer, *pad(self.src.starts, 0),
                *pad(self.src.sizes, 1), *pad(self.dst.starts, 0), *pad(self.dst.sizes, 1)]


@dataclasses.dataclass
class Layout:
    """What both tracing passes share: the options, and the DMA sites the first pass met
    (a landing from the table writes each site's copy where the DMA is that site's)."""

    races: bool
    eager: bool
    fill: str
    sites: list[DmaSite] = dataclasses.field(default_factory=list)
    site_ids: dict[tuple[object, ...], int] = dataclasses.field(default_factory=dict)
    frozen: bool = False
    # Whether the trace took something from the sites that a site met later changes (it
    # is then traced again, with all of them: `program.build`; see `_changes`).
    stale: bool = False
    # What the trace took from the sites known when it was traced: the semaphore arrays a
    # wait landed DMAs on or counted its trips for (a landing writes the copy of each
    # site on its semaphore), and the buffers (allocation serials) a loop or branch that
    # may land DMAs carried, with the semaphores its waits are on (None: any; a landing
    # into another buffer would be lost at its end). Each with the number of allocations
    # made by then: a site of a buffer allocated later was not live there (a landing
    # moves only live sites' DMAs), so it changes nothing.
    landed_on: dict[int, float] = dataclasses.field(default_factory=dict)
    # The smallest site's bytes a wait's trip count on a semaphore array was reckoned
    # from (a site met later that moves fewer changes it).
    trips_from: dict[int, float] = dataclasses.field(default_factory=dict)
    carried: set[tuple[frozenset[int], frozenset[int] | None, int]] = dataclasses.field(
        default_factory=set)
    # The buffers (by allocation serial) whose written-shadow must be kept per element: a
    # kernel accessed part of them. Any other scratch buffer or output block keeps one
    # bool, whether it is all written (`State.written_in`); a pass that finds a part
    # accessed adds the buffer here and sets `refine` (the call is traced again).
    fine_shadows: set[int] = dataclasses.field(default_factory=set)
    refine: bool = False
    # The kernel's ref variables some access covers only in part (found before tracing:
    # `jaxpr_facts.accessed_in_part`): their scratch buffers and output blocks start with a
    # shadow per element.
    accessed_in_part: frozenset[Any] = frozenset()
    # Whether the kernel uses the old value a swap returns, which reads an element
    # without the written check: an output block that moves is then refilled with the
    # never-written fill, as the engine's is (otherwise no standing run can tell: a read
    # of an element not written since is flagged, and so is its write-back).
    swaps_read: bool = False
    # Races on: the buffers (allocation serial, and whether for a write) an access was
    # not compared with the DMA table for, because no known site had them as its
    # destination (or, for a write, its source).
    unreached: set[tuple[int, bool]] = dataclasses.field(default_factory=set)

    def swap_read(self) -> None:
        """A swap whose old value the kernel uses (traced again, refilling blocks)."""
        if not self.swaps_read:
            self.swaps_read = self.refine = True

    def site(self, key: tuple[object, ...], make: DmaSite) -> int:
        found = self.site_ids.get(key)
        if found is None:
            if self.frozen:
                raise Unsupported("a DMA the first tracing pass did not meet")
            found = self.site_ids[key] = len(self.sites)
            self.sites.append(make)
            self.stale = self.stale or self._changes(make)
        return found

    def _changes(self, site: DmaSite) -> bool:
        """Whether a site met now changes what the trace took from the sites before it."""
        newest = max(site.dst_serial, site.src_serial)
        return (newest < self.landed_on.get(site.sem, -1)
                or site.nbytes < self.trips_from.get(site.sem, -1)
                or any(site.dst_serial not in serials and (sems is None or site.sem in sems)
                       and newest < allocations for serials, sems, allocations in self.carried)
                or (site.dst_serial, False) in self.unreached
                or (site.dst_serial, True) in self.unreached
                or (site.src_serial, True) in self.unreached)

    def lands_on(self, sem: int, allocations: float = math.inf) -> None:
        """A wait on semaphore array `sem` traced as the sites on it are known (those of
        the first `allocations` buffers, where it lands only live sites' DMAs)."""
        self.landed_on[sem] = max(self.landed_on.get(sem, -1), allocations)

    def reaches(self, serial: int, write: bool) -> bool:
        """Whether a DMA site known has the buffer of allocation `serial` as its
        destination (or, `write`, its source): else no DMA in flight can meet an access
        of it. The answer is remembered (a site met later that has it makes the trace
        stale)."""
        if any(s.dst_serial == serial or (write and s.src_serial == serial)
               for s in self.sites):
            return True
        self.unreached.add((serial, write))
        return False

    def trips(self, sem: int, wanted: int) -> int | None:
        """How many DMAs on semaphore array `sem` a wait for `wanted` bytes can land or
        retire at most, when that is known from the sites (each moves at least the
        smallest site's bytes, and a DMA semaphore's count is never below 0); None when
        no site signals `sem`. The answer depends on the sites known, so a site met
        later moving fewer bytes makes the trace stale."""
        smallest = min((s.nbytes for s in self.sites if s.sem == sem), default=0)
        self.trips_from[sem] = min(self.trips_from.get(sem, math.inf),
                                   smallest if smallest > 0 else math.inf)
        if smallest <= 0:
            return None
        return max(1, -(-wanted // smallest))


class State:
    """The call's state at one point of tracing (see the module docstring)."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.buffers: list[BufferInfo] = []
        self.values: list[jax.Array] = []
        self.shadows: list[jax.Array | None] = []
        self.semaphores: list[SemInfo] = []
        self.counts = jnp.zeros((0,), jnp.int32)
        self.table = Table.empty()
        self.verdict = jnp.zeros((), jnp.int32)
        # Races on, what the race check covered: the accesses checked against the DMAs in
        # flight, and the most DMAs in flight at once (the JSON report's `races`).
        self.coverage = jnp.zeros((2,), jnp.int32)
        self.allocations = 0
        self.started: list[Started] = []
        # Races on: the rows written into the table by the latest run of DMA starts (the
        # table is `_appended_to` plus them, while it is `_appended_tip`): a race check
        # compares an access with `_appended_to` and with these box against box, so that
        # XLA does not fuse the chain of row writes into every check that reads the table
        # (a check per DMA start: quadratic in a run of starts).
        self._appended: list[Started] = []
        self._appended_to: Table | None = None
        self._appended_tip: Table | None = None
        # Whether the table may hold an active row here (false: no row was written on any
        # path to this point of the trace).
        self.maybe_active = False
        # Coverage this stretch counted at trace time, not yet in `coverage`: accesses
        # checked, and the most DMAs in flight at once.
        self.checked, self.most_in_flight = 0, 0

    # -- the state as a pytree ---------------------------------------------------------

    def carry(self, buffers: Sequence[int] | None = None) -> Carry:
        """The state as a pytree: every buffer, or only `buffers` (what a loop or branch
        may write; the others it reads as they are, closed over). Control flow follows:
        the DMAs started are written into the table and the trace forgets them."""
        self.forget()
        self.flush_coverage()
        ids = range(len(self.values)) if buffers is None else buffers
        return (tuple(self.values[b] for b in ids), tuple(self.shadows[b] for b in ids),
                self.counts, self.table, self.verdict, self.coverage)

    def restore(self, carry: Carry, buffers: Sequence[int] | None = None) -> None:
        values, shadows, self.counts, self.table, self.verdict, self.coverage = carry
        self.started = []
        self.checked, self.most_in_flight = 0, 0  # (the carry's counts hold them)
        if buffers is None:
            self.values, self.shadows = list(values), list(shadows)
            return
        for b, value, shadow in zip(buffers, values, shadows):
            self.values[b], self.shadows[b] = value, shadow

    def enter(self, carry: Carry, buffers: Sequence[int] | None, assumed: bool) -> None:
        """A loop body's or branch's start: the state it is handed, and what it may take
        the table to hold (`loop`)."""
        self.restore(carry, buffers)
        self.maybe_active = assumed

    def leave(self, buffers: Sequence[int] | None, exits: list[bool]) -> Carry:
        """A loop body's or branch's end: the state it hands on; `exits` notes whether the
        table may hold a row now."""
        carry = self.carry(buffers)
        exits.append(self.maybe_active)
        return carry

    def loop(self, trace: Callable[[bool, list[bool]], _Traced],
             trips: int | None = None) -> _Traced:
        """A loop of `trips` trips (None: not known) traced by `trace(assumed, exits)`: its
        body starts with `maybe_active` set to `assumed` and appends to `exits` what it is
        at the body's end. A body may follow itself, so one that leaves rows where it
        assumed none is traced again, assuming some (the first trace is dropped); one
        trip is straight-line code, traced once."""
        entry = self.maybe_active
        exits: list[bool] = []
        result = trace(entry, exits)
        if trips == 1:
            self.maybe_active = exits[-1]
            return result
        if not entry and any(exits):
            exits.clear()
            result = trace(True, exits)
        self.maybe_active = entry or any(exits)
        return result

    def flush_coverage(self) -> None:
        """What this stretch counted at trace time, added to the traced coverage."""
        if self.checked or self.most_in_flight:
            self.coverage = jnp.stack([self.coverage[0] + self.checked,
                                       jnp.maximum(self.coverage[1], self.most_in_flight)])
        self.checked, self.most_in_flight = 0, 0

    def take_counted(self) -> tuple[int, int]:
        """What this stretch counted at trace time, taken out of it: a loop of known trips
        adds its body's count once, times the trips (`note_checked`), not on each trip."""
        counted = (self.checked, self.most_in_flight)
        self.checked, self.most_in_flight = 0, 0
        return counted

    def note_checked(self, accesses: int, in_flight: Any = None) -> None:
        """Races on: `accesses` checked against the DMAs in flight; `in_flight`, how many
        there are with a DMA just started (a Python int where the trace knows it)."""
        self.checked += accesses
        if isinstance(in_flight, int):
            self.most_in_flight = max(self.most_in_flight, in_flight)
        elif in_flight is not None:
            self.coverage = self.coverage.at[1].max(in_flight)

    def add_count(self, cell: Any, amount: Any) -> None:
        """`amount` added to semaphore cell `cell`'s count, as one elementwise select-add
        over the (small) vector: a scatter would be preceded by a copy wherever the old
        counts are still read."""
        here = lax.broadcasted_iota(jnp.int32, self.counts.shape, 0) == cell
        self.counts = self.counts + jnp.where(here, jnp.asarray(amount, jnp.int32), 0)

    def in_flight(self) -> Any:
        """How many DMAs are in flight: the stretch's own not in the table, and the
        table's active rows when it may hold any."""
        own = sum(1 for s in self.started if s.slot is None)
        if not self.maybe_active:
            return own
        return jnp.sum(self.table["active"].astype(jnp.int32)) + own

    def snapshot(self) -> tuple[list[jax.Array], list[jax.Array | None]]:
        return list(self.values), list(self.shadows)

    def reset(self, snapshot: tuple[list[jax.Array], list[jax.Array | None]]) -> None:
        """Back to the buffers of `snapshot` (what a traced loop body left in the
        buffers it does not carry belongs to that trace)."""
        assert all(s.slot is not None for s in self.started), "a DMA the table lacks"
        self.values, self.shadows = list(snapshot[0]), list(snapshot[1])
        self.started = []

    # -- the DMAs the trace knows ------------------------------------------------------

    def write_started(self, sem: int | None = None) -> None:
        """The started DMAs (on semaphore array `sem`, or all) written into the table,
        in the order they started; eager: the count of each, landed at its start."""
        for k, started in enumerate(self.started):
            if started.slot is None and sem in (None, started.sem):
                if started.landed:
                    self.add_count(started.cell, started.site.nbytes)
                t = self.table
                if self.maybe_active:
                    self.flag(jnp.all(t["active"]), Verdict.TABLE_FULL)
                slot = jnp.argmin(t["active"])
                if t is not self._appended_tip:  # (changed otherwise since: a new run)
                    self._appended_to = t if self.maybe_active else None
                    self._appended = []
                self.table = t.started(slot, started.row(t.clock))
                self.started[k] = dataclasses.replace(started, slot=slot)
                self.maybe_active = True
                self._appended.append(self.started[k])
                self._appended_tip = self.table

    def forget(self, sem: int | None = None) -> None:
        """The started DMAs on semaphore array `sem` (or all) are no longer known to be
        the newest on their cells: written into the table, then forgotten."""
        self.write_started(sem)
        self.started = [s for s in self.started if sem is not None and s.sem != sem]

    def live(self, site: DmaSite) -> bool:
        """Whether the site's buffers are the allocations it was traced with (a site in
        a scope that has ended moves nothing)."""
        n = len(self.buffers)
        return (site.src < n and site.dst < n
                and self.buffers[site.src].serial == site.src_serial
                and self.buffers[site.dst].serial == site.dst_serial)

    def landing_targets(self, carried_with: set[int] | frozenset[int] = frozenset(),
                        sems: set[int] | None = None) -> set[int]:
        """The buffers a wait on semaphore arrays `sems` (None: any) may land a DMA in
        (on_wait: a DMA's on them), which a loop or branch that may land DMAs carries,
        with `carried_with`."""
        if self.layout.eager:
            return set()
        found = {site.dst for site in self.layout.sites
                 if self.live(site) and (sems is None or site.sem in sems)}
        self.layout.carried.add((frozenset(self.buffers[b].serial
                                           for b in found | set(carried_with)),
                                 None if sems is None else frozenset(sems), self.allocations))
        return found

    def overlaps_in_flight(self, b: int, starts: Sequence[Index], sizes: Sequence[int],
                           write: bool) -> Any:
        """Whether a box of buffer `b` meets a DMA in flight: its destination (any
        access), or its source (a write). The stretch's own DMAs are compared box
        against box (nothing to compute for another buffer's), and so are the rows the
        latest run of starts wrote, the table compared as it was before them; the table is
        read only when it may hold a row and some DMA site can move the buffer (a
        scalar-prefetch ref, a block no DMA touches: nothing to compare). A traced bool,
        or a Python one."""
        hits: list[Any] = []
        t: Table | None = self.table if self.maybe_active else None
        own = [s for s in self.started if s.slot is None]  # (a row's is the table's)
        if self.table is self._appended_tip:
            t, own = self._appended_to, own + self._appended
        for started in own:
            for ref in (started.dst, started.src) if write else (started.dst,):
                if ref.buffer == b:
                    hits.append(boxes_meet(ref.starts, ref.sizes, starts, sizes))
        if t is not None and self.layout.reaches(self.buffers[b].serial, write):
            start, size = padded(starts, 0), padded(sizes, 1)
            hit = t["active"] & (t["dst_buf"] == b) & meets(t["dst_start"], t["dst_size"],
                                                             start, size)
            if write:
                hit = hit | (t["active"] & (t["src_buf"] == b)
                             & meets(t["src_start"], t["src_size"], start, size))
            hits.append(jnp.any(hit))
        return any_of(hits)

    # -- written-shadows ----------------------------------------------------------------

    def _coarse(self, b: int, sizes: Sequence[int]) -> bool:
        """Whether buffer `b` keeps one bool for its shadow; a box of part of such a
        buffer asks for a per-element shadow in the next pass (until then the one bool
        answers for the box: at worst a verdict bit the engine's run clears)."""
        shadow = self.shadows[b]
        if shadow is None or shadow.ndim or not self.buffers[b].shape:
            return False
        if tuple(sizes) != tuple(self.buffers[b].shape):
            self.layout.fine_shadows.add(self.buffers[b].serial)
            self.layout.refine = True
        return True

    def written_in(self, b: int, starts: Sequence[Index], sizes: Sequence[int]) -> Any:
        """Whether every element of a box of buffer `b` (one with a shadow) is written."""
        shadow = self.shadows[b]
        assert shadow is not None
        if self._coarse(b, sizes):
            return shadow
        return all_set(take(shadow, starts, sizes))

    def mark_written(self, b: int, starts: Sequence[Index], sizes: Sequence[int],
                     where: Any = True) -> None:
        """A box of buffer `b` written (where `where`, a traced bool, holds)."""
        shadow = self.shadows[b]
        if shadow is None:
            return
        if self._coarse(b, sizes):
            if tuple(sizes) == tuple(self.buffers[b].shape):
                self.shadows[b] = jnp.bool_(True) if where is True else (shadow | where)
            return
        written: Any = jnp.ones(tuple(sizes), bool)
        if where is not True:
            written = take(shadow, starts, sizes) | where
        self.shadows[b] = put(shadow, written, starts)

    # -- verdict and semaphores --------------------------------------------------------

    def flag(self, condition: Any, bit: Verdict) -> None:
        """Set `bit` where `condition` (a traced or static bool) holds."""
        if isinstance(condition, (bool, np.bool_)):
            if condition:
                self.verdict = self.verdict | int(bit)
            return
        if isinstance(condition, jax.Array) and condition.shape == ():
            raised = lax.select(condition, np.int32(int(bit)), np.int32(0))
        else:
            raised = jnp.where(condition, jnp.int32(int(bit)), 0)
        self.verdict = either(self.verdict, raised)

    def cell(self, ref: Ref) -> jax.Array:
        """The count index of the one semaphore `ref` selects."""
        if not ref.sem:
            raise Unsupported("a semaphore operation on a buffer")
        if any(ref.kept) and math.prod(ref.sizes) != 1:
            raise Unsupported("a semaphore array used whole")
        sem = self.semaphores[ref.buffer]
        flat: Index = sem.base
        stride = 1
        for start, size in reversed(list(zip(ref.starts, sem.shape))):
            self.flag(outside(start, 1, size), Verdict.OUT_OF_BOUNDS)
            flat = plus(flat, times(start, stride))
            stride *= size
        last = sem.base + max(math.prod(sem.shape), 1) - 1
        return lax.clamp(np.int32(sem.base), i32(flat), np.int32(last))


