"""The call's access feed (`AccessFeed`, a part of engine/call/state.py's `CallState`):
each memory access as an `Access` event for the listeners that take accesses (the race
checker), except those of buffers no race can involve (engine/call/unraced.py), which
are only counted.

With races on, a paged attention kernel makes about 900 accesses a call; a third are
scalar loads of its page table, and a DMA reads each K/V page in HBM: buffers nothing
writes. Building their events and walking their histories was about half of what race
checking cost there (benchmarks/README.md, issue 55.4).
"""

from __future__ import annotations

from typing import Callable

from pallas_check.engine.call.event_data import AccessesLeftOut
from pallas_check.engine.events import Access, Feeds, Listener, kinds_taken, make_access
from pallas_check.engine.jaxpr.program import current_frames
from pallas_check.engine.memory.buffer import Buffer
from pallas_check.engine.memory.region import Region
from pallas_check.engine.seam import RunningCore
from pallas_check.findings.finding import IndexRange, SourceFrame


_CARRY_ACCESSES = frozenset({"access", "dma_moved", "copy_moved", "kernel_entered"})


def leaves_out(listeners: tuple[Listener, ...], feeds: Feeds) -> bool:
    """Whether accesses of buffers nothing writes may be left out: some listener takes
    accesses, and every listener of an event that carries accesses reads them for races
    alone (the timeline reads none: it says so too)."""
    return bool(feeds.access) and all(
        not listener.needs_unwritten_accesses for listener in listeners
        if _CARRY_ACCESSES.intersection(kinds_taken(type(listener))))  # type: ignore[arg-type]


class AccessFeed:
    """The access events of a call; CallState sets the fields below."""

    feeds: Feeds
    races: tuple[Callable[[Access], None], ...] | None
    # Accesses of buffers no race can involve may be left out (`leaves_out`), the ids of
    # the buffers bound to a ref some equation may write, or some other actor than its
    # core touch (unraced.py `bind`), and how many accesses were left out so far.
    leave_out: bool
    # A DMA read left out that signals nothing makes no event: accesses are left out, and
    # no listener of `dma_moved` takes such a read (`Listener.takes_empty_dma_reads`).
    quiet_reads: bool
    owed_taken: bool  # some listener of `waited` reads `Waited.owed`
    raced_ids: set[int]
    shared_ids: set[int]
    left_out: int

    def start_access_feed(self, listeners: tuple[Listener, ...]) -> None:
        """Once `feeds` are made: the listeners fed accesses (`races`, None when none is:
        rules skip resolving what an access touched then), and whether accesses of
        buffers no race can involve may be left out (unraced.py decides which)."""
        self.races = self.feeds.access or None
        self.leave_out, self.left_out = leaves_out(listeners, self.feeds), 0
        self.quiet_reads = self.leave_out and all(
            not listener.takes_empty_dma_reads for listener in listeners
            if "dma_moved" in kinds_taken(type(listener)))  # type: ignore[arg-type]
        self.owed_taken = any(
            listener.takes_owed for listener in listeners
            if "waited" in kinds_taken(type(listener)))  # type: ignore[arg-type]
        self.raced_ids, self.shared_ids = set(), set()

    def access(self, ctx: RunningCore, region: Region, is_write: bool, operation: str,
               actor: str | None = None, frames: tuple[SourceFrame, ...] | None = None,
               atomic_add: bool = False) -> None:
        """An actor touched a region (only the race checker listens; the callers skip
        this when `races` is None). `atomic_add`: an atomic read-modify-write add, which
        never races with another."""
        takers = self.feeds.access
        if not takers:
            return
        buf = region.buffer
        if buf.unraced:  # nothing writes it in this call: no race can involve it
            self.left_out += len(region.boxes()) if region.post else 1
            return
        if frames is None:
            frames = current_frames(ctx)
        actor, point = actor or ctx.actor, ctx.grid_point
        for box in region.boxes():  # one box unless seen through a reshape / bitcast
            event = make_access((actor, buf.id, buf.name, buf.space, box, is_write, operation,
                                 frames, point, atomic_add))
            for take in takers:
                take(event)

    def access_box(self, ctx: RunningCore, buffer: Buffer, box: IndexRange, is_write: bool,
                   operation: str, frames: tuple[SourceFrame, ...]) -> None:
        """`access` of one box of `buffer` the caller already knows, with its frames (a
        scalar read by in-bounds indices, engine/rules/access.py: no region is made for
        it; the caller counts it instead where the buffer is `unraced`)."""
        event = make_access((ctx.actor, buffer.id, buffer.name, buffer.space, box, is_write,
                             operation, frames, ctx.grid_point, False))
        for take in self.feeds.access:
            take(event)

    def on_write(self, ctx: RunningCore, region: Region) -> None:
        if self.feeds.access:
            if region.buffer.unraced and not region.post:  # (`access`'s test, inlined)
                self.left_out += 1
            else:
                self.access(ctx, region, True, "write")

    def left_out_of(self, region: Region) -> bool:
        """Whether no race can involve `region`'s buffer (its accesses counted here, then
        left out by the caller: a DMA's read of its source)."""
        if region.buffer.unraced:  # (one box unless seen through a reshape / bitcast)
            self.left_out += len(region.boxes()) if region.post else 1
            return True
        return False

    def left_out_one(self) -> None:
        """One access of an `unraced` buffer, left out by the caller (a scalar load, a
        pipeline copy's HBM block)."""
        self.left_out += 1

    def tell_left_out(self) -> None:
        """At the end of the run: how many accesses were left out (accesses_checked)."""
        if self.left_out:
            event = AccessesLeftOut(self.left_out)
            for take in self.feeds.accesses_left_out:
                take(event)
            self.left_out = 0
