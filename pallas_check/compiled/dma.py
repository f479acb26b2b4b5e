"""DMAs and semaphores on the compiled call's state: start, land, wait, retire, signal.

As the engine does it (engine/dma/policy.py), on one core: `on_wait`, a wait lands the DMAs
on its semaphore cell newest first until the count covers it; `eager`, a start lands at
once. A wait then takes its count and retires the landed DMAs its bytes cover, newest
first; what is left in the table at the end was never waited.

Most waits wait for the DMA the same stretch of straight-line code started last on the same
cell (`copy.start(); ...; copy.wait()`). That DMA is the newest on the cell, so it is the
one the wait lands, and when its bytes cover the wait it is also the one the wait retires:
the wait takes it as the trace knows it (`State.started`), with no search of the table,
no loop, and no table row when none was written. One case needs the search: a count
that already covers the wait before the DMA lands (what lands is then another's choice):
it sets COUNT_AHEAD and the engine runs the call.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax

from pallas_check.compiled.boxes import Index, any_of, at, i32, outside, put, take
from pallas_check.compiled.refs import Carry, Ref, Unsupported
from pallas_check.compiled.state import Started, State
from pallas_check.compiled.table import DmaSite, Table
from pallas_check.compiled.verdict import Verdict

# A wait that can land or retire at most this many DMAs is traced as straight-line code,
# one guarded landing or retirement each; more, and it is an XLA while loop.
_UNROLLED_TRIPS = 4


class Dmas(State):
    """The state with its DMA engine."""

    def dma_start(self, key: tuple[object, ...], src: Ref, dst: Ref, sem: Ref) -> None:
        """A DMA starts: its boxes checked, known to the trace as the newest on its cell
        (written into the table when something reads the table); eager: it lands."""
        cell = self.cell(sem)
        src_info, dst_info = self.buffers[src.buffer], self.buffers[dst.buffer]
        nbytes = math.prod(dst.shape) * dst_info.dtype.itemsize
        if math.prod(src.shape) != math.prod(dst.shape) or src_info.dtype != dst_info.dtype:
            raise Unsupported("a DMA between views of other sizes or element types")
        site_id = self.layout.site(
            (*key, src_info.serial, dst_info.serial, sem.buffer),
            DmaSite(src.buffer, dst.buffer, src_info.serial, dst_info.serial, src.sizes,
                    dst.sizes, nbytes, sem.buffer))
        site = self.layout.sites[site_id]
        for ref in (src, dst):
            self.flag(any_of(outside(s, n, m) for s, n, m in
                             zip(ref.starts, ref.sizes, self.buffers[ref.buffer].shape)),
                      Verdict.OUT_OF_BOUNDS)
        if self.layout.races:
            self.flag(self.overlaps_in_flight(src.buffer, src.starts, src.sizes, False)
                      | self.overlaps_in_flight(dst.buffer, dst.starts, dst.sizes, True),
                      Verdict.RACE)
            self.note_checked(2, self.in_flight() + 1)  # its read and its write
        if self.layout.eager:  # it lands now: its own site, no search (its count is
            self._land_site(site, True, src.starts, dst.starts)  # added with its row)
        self.forget(sem.buffer)  # (no longer the newest on their cells, maybe)
        self.started.append(Started(sem.buffer, sem.starts, cell, site_id, site, src, dst,
                                    landed=self.layout.eager))

    def _land(self, slot: jax.Array, sem: int, go: Any = True, book: bool = True) -> Any:
        """The DMA in `slot` (one on semaphore array `sem`) moves its data and signals its
        semaphore, where `go` (a traced bool, or True) holds. Each live site of `sem`
        writes its copy where the slot's site is that site and leaves its box as it was
        elsewhere: straight-line code that XLA updates in place (a switch over the sites
        copied the buffers it carried). Returns where it landed (False: nowhere); with
        `book` false the caller adds its bytes to the count and marks its row."""
        self.layout.lands_on(sem, self.allocations)
        t = self.table
        site_of = t.at(slot, "site")
        src_start, dst_start = t.at(slot, "src_start"), t.at(slot, "dst_start")
        moved: Any = False  # whether a site this trace knows moved the slot's data
        for k, site in enumerate(self.layout.sites):
            if site.sem == sem and self.live(site):
                this = site_of == k
                self._land_site(site, this if go is True else this & go,
                                src_start, dst_start)
                moved = this if moved is False else (moved | this)
        if moved is False:  # no site could move it: nothing lands (the wait is unmet)
            return False
        go = moved if go is True else (moved & go)
        if book:
            t = self.table
            self.add_count(t.at(slot, "sem"), jnp.where(go, t.at(slot, "bytes"), 0))
            self.table = t.set_where(slot, "landed", 1, go)
        return go

    def _land_site(self, site: DmaSite, this: Any, src_start: Any, dst_start: Any) -> None:
        """One site's copy where `this` (a traced bool, or True); its starts a table
        row's or as traced."""
        src_at = [src_start[d] for d in range(len(site.src_sizes))]
        dst_at = [dst_start[d] for d in range(len(site.dst_sizes))]
        value = take(self.values[site.src], src_at, site.src_sizes)
        if self.shadows[site.src] is not None:
            self.flag(this & ~self.written_in(site.src, src_at, site.src_sizes),
                      Verdict.UNINITIALIZED)
        value = value.reshape(site.dst_sizes)
        if this is not True:
            value = jnp.where(this, value, take(self.values[site.dst], dst_at, site.dst_sizes))
        self.values[site.dst] = put(self.values[site.dst], value, dst_at)
        self.mark_written(site.dst, dst_at, site.dst_sizes, this)

    def wait(self, sem: Ref, wanted: Index, decrement: bool = True) -> None:
        """A wait for `wanted` on semaphore cell `sem`: DMAs on it land (on_wait) until
        the count covers it; a count that cannot is WAIT_UNMET (one core: nothing else
        will signal); then the count is taken and the DMAs it covers retire."""
        cell = self.cell(sem)
        paired = next((s for s in self.started if s.waited_by(sem)), None)
        if paired is not None and isinstance(wanted, (int, np.integer)) \
                and wanted <= paired.site.nbytes:
            self.started.remove(paired)
            self.forget(sem.buffer)
            self._wait_paired(paired, int(wanted), decrement)
            return
        self.forget(sem.buffer)  # (this wait may land and retire them)
        self.write_started()
        trips = (self.layout.trips(sem.buffer, int(wanted))
                 if isinstance(wanted, (int, np.integer)) else None)
        if trips == 1 and int(wanted) > 0:
            self._wait_one(cell, int(wanted), sem.buffer, decrement)
            return
        wanted = i32(wanted)
        if not self.layout.eager and self.layout.sites:
            self._land_until(cell, wanted, sem.buffer, trips)
        elif not self.layout.eager:
            self.layout.lands_on(sem.buffer)  # (no site known: nothing lands)
        met = at(self.counts, cell) >= wanted
        self.flag(~met, Verdict.WAIT_UNMET)
        if decrement:
            self.add_count(cell, -jnp.where(met, wanted, 0))
        self._retire(cell, wanted, trips)

    def _wait_one(self, cell: jax.Array, wanted: int, sem: int, decrement: bool) -> None:
        """A wait that one DMA covers (each DMA on its semaphore moves at least `wanted`
        bytes): the newest DMA on the cell lands (on_wait) and retires, with one search
        of the table and one write of its row and of the count. That is the general
        wait's outcome whenever the newest DMA on the cell is still pending and the count
        short of the wait; otherwise (a DMA landed before its wait, or a count already
        covering it) what lands is the engine's to say: COUNT_AHEAD. Eager, every DMA
        in the table has landed and the newest retires, as in the general wait."""
        t = self.table
        mine = t["active"] & (t["sem"] == cell)
        slot = t.newest(mine)
        has = at(mine, slot)
        if self.layout.eager:
            landed: Any = has
            added: Any = 0
        else:
            before = t.at(slot, "landed")
            short = at(self.counts, cell) < wanted
            self.flag(has & (before | ~short), Verdict.COUNT_AHEAD)
            # (one trip means a site signals `sem`: `Layout.trips`)
            landed = self._land(slot, sem, has & short & ~before, book=False)
            added = 0 if landed is False else jnp.where(landed, t.at(slot, "bytes"), 0)
        met = at(self.counts, cell) + added >= wanted
        self.flag(~met, Verdict.WAIT_UNMET)
        taken = jnp.where(met, wanted, 0) if decrement else 0
        if not (isinstance(added, int) and isinstance(taken, int) and added == taken == 0):
            self.add_count(cell, added - taken)
        if landed is not False:  # it retires (the wait's bytes, > 0, are left for it)
            self.table = self.table.set_where(slot, "active", 0, landed)

    def _wait_paired(self, paired: Started, wanted: int, decrement: bool) -> None:
        """The wait of the DMA `paired`, the newest on its cell, whose bytes cover it: it
        lands (on_wait) and retires; the count, at least 0 before, covers the wait."""
        if paired.slot is not None:
            self.table = self.table.set(paired.slot, "active", 0)
        taken = wanted if decrement else 0
        if not paired.landed:
            self.flag(at(self.counts, paired.cell) >= wanted, Verdict.COUNT_AHEAD)
            self._land_site(paired.site, True, paired.src.starts, paired.dst.starts)
        counted = paired.landed and paired.slot is not None  # eager: added with its row
        added = (0 if counted else paired.site.nbytes) - taken
        if added:
            self.add_count(paired.cell, added)

    def _land_until(self, cell: jax.Array, wanted: jax.Array, sem: int,
                    trips: int | None) -> None:
        """on_wait: the DMAs on `cell` land newest first until the count covers the wait.
        When at most `trips` (a few) can land, the loop is unrolled: each trip lands the
        newest pending DMA where the count is still short (no XLA loop to run)."""
        def pending(t: Table) -> jax.Array:
            return t["active"] & ~t["landed"] & (t["sem"] == cell)

        def short(counts: jax.Array, t: Table) -> jax.Array:
            return (at(counts, cell) < wanted) & jnp.any(pending(t))

        def land_newest(go: Any) -> None:
            self._land(self.table.newest(pending(self.table)), sem, go)

        if trips is not None and trips <= _UNROLLED_TRIPS:
            for _ in range(trips):
                land_newest(short(self.counts, self.table))
            return
        targets = sorted(self.landing_targets(sems={sem}))

        def trip(carry: Carry) -> Carry:
            self.restore(carry, targets)
            land_newest(True)
            return self.carry(targets)

        before = self.snapshot()
        carry = lax.while_loop(lambda c: short(c[2], c[3]), trip, self.carry(targets))
        self.reset(before)
        self.restore(carry, targets)

    def _retire(self, cell: jax.Array, left: jax.Array, trips: int | None) -> None:
        """The landed DMAs on `cell` retire newest first while the wait has bytes left
        (unrolled, as a landing is, when at most a few can retire)."""
        def landed(t: Table) -> jax.Array:
            return t["active"] & t["landed"] & (t["sem"] == cell)

        def uncovered(left: jax.Array, t: Table) -> jax.Array:
            return (left > 0) & jnp.any(landed(t))

        def retire_newest(left: jax.Array, t: Table, go: Any) -> tuple[jax.Array, Table]:
            slot = t.newest(landed(t))
            return left - jnp.where(go, t.at(slot, "bytes"), 0), t.set_where(slot, "active", 0, go)

        if trips is not None and trips <= _UNROLLED_TRIPS:
            for _ in range(trips):
                left, self.table = retire_newest(left, self.table, uncovered(left, self.table))
            return
        _, self.table = lax.while_loop(lambda c: uncovered(*c),
                                       lambda c: retire_newest(*c, True), (left, self.table))

    def count(self, sem: Ref) -> jax.Array:
        """A semaphore's count as the kernel reads it (eager DMAs' counts added)."""
        self.write_started(sem.buffer)
        return at(self.counts, self.cell(sem))

    def signal(self, sem: Ref, amount: Index) -> None:
        """A signal. A DMA semaphore's count may only grow (a wait's newest-first landing
        stops when the count covers it: `_wait_paired` relies on counts of at least 0)."""
        cell = self.cell(sem)
        if self.semaphores[sem.buffer].counts_bytes and not (
                isinstance(amount, (int, np.integer)) and amount >= 0):
            raise Unsupported("a DMA semaphore signalled by a traced or negative amount")
        self.forget(sem.buffer)
        self.add_count(cell, i32(amount))
