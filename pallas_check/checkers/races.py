"""Race detection: happens-before with vector clocks (vector_clock.py), one per actor.

Actors are cores and DMAs (each DMA is its own actor, whose clock starts as its starter's
clock at the start). Edges: program order; DMA start -> the DMA's read and write;
the DMA -> its semaphores; semaphore signal -> the wait that consumes it; barriers; on a
chip that runs a TensorCore mesh's cores one after another, a core's end -> the next's start.
A finished DMA's clock slot is reused by a later DMA of the same starter only when the
starter has seen (waited for) every access of the finished one: then the later DMA is
ordered after the earlier, epochs in the slot keep growing, and every happens-before
answer is the same as with a slot per DMA — so no DMA-DMA race is hidden, and clocks stay
as small as the number of DMAs in flight instead of growing with every DMA ever started.

Per buffer only the accesses not yet ordered before a newer, covering access are kept
(FastTrack-style pruning): an access P ordered before a new access N whose range covers
P's, with N a write or P a read, can only race with later accesses that would race with N
too — so P is dropped and the cost per access stays near constant as a kernel runs on.
Accesses to disjoint parts of a buffer are never covered; once the call's cores are
declared (`declare`), a record that every actor still live (cores whose grid is not done,
DMAs in flight) has ordered before its clock is dropped too, in a sweep each time a
buffer's history doubles, so a long grid keeps only a few records per buffer.

An access that repeats its buffer's newest record (the same box, actor, epoch and kind,
the actor's clock unchanged since, and that record met no race) skips the walk: the walk
would find nothing and leave the same records, with this access's frames in the newest's
place (issue 55.4: a kernel reads its page table's entries again within a step).
"""

from __future__ import annotations

from typing import Hashable, Iterable

from pallas_check.checkers.base import Checker
from pallas_check.checkers.race_help import race_help
from pallas_check.checkers.race_history import SWEEP_AFTER, AccessRecord, History
from pallas_check.checkers.vector_clock import Released, VectorClock
from pallas_check.engine import events
from pallas_check.engine.call.event_data import AccessesLeftOut  # declared where it is built
from pallas_check.engine.call.serial import SerialStart  # declared where it is built
from pallas_check.findings.finding import Finding, FindingKind, IndexRange, format_range


_new_record = tuple.__new__  # (an AccessRecord from its fields in order: faster than its
#                             constructor, which takes keywords and defaults)


class RaceChecker(Checker):
    """Collects the races of one simulation of a pallas_call, a listener of the engine's
    happens-before feed (engine/events.py); each race is emitted as a Finding."""

    # Accesses of a buffer nothing writes during the call are left out (no race can
    # involve them: engine/call/unraced.py), and counted (`on_accesses_left_out`).
    needs_unwritten_accesses = False
    takes_empty_dma_reads = False  # (a DmaMoved with no access and no semaphore: no edge)
    takes_owed = False

    def __init__(self, call: events.CallFacts, sink: events.FindingSink) -> None:
        super().__init__(call, sink)
        self.clocks: dict[str, VectorClock] = {}
        # What each semaphore cell or barrier was released with (joined over releases).
        self.sync_clocks: dict[Hashable, VectorClock] = {}
        self.history: dict[int, History] = {}
        self.checked = 0  # accesses checked (CallSummary.races: what race checking covered)
        # Clock slots: an actor's own entry in the clocks (its name, or a reused DMA slot).
        self.slot_of: dict[str, str] = {}
        self._parent: dict[str, str] = {}  # DMA -> the actor that started it
        self._last_epoch: dict[str, int] = {}  # DMA -> epoch of its latest access
        self._free: dict[str, list[tuple[str, int, int]]] = {}  # starter -> (slot, needed, next)
        # Actors that may still access memory: the call's cores (see `declare`) and the
        # DMAs in flight. None: not declared, so records are pruned only by coverage.
        self.live: set[str] | None = None
        # parallel_loop iterations (see `fork_iteration`): per iteration slot, the latest
        # epoch an iteration of that slot reached, so that a later one starts after it.
        self._iteration_top: dict[str, int] = {}
        # The parallel_loops in progress, per actor running them (innermost last): the
        # clock each iteration starts from, and what the loop's end knows.
        self._loops: dict[str, list[tuple[VectorClock, VectorClock]]] = {}
        # How many times an actor's clock learnt from another's (a wait, a join): a
        # repeated access may skip the walk only if its actor's clock did not change.
        self._joins = 0
        # The call's cores (`declare`): their clocks only grow, so one knows all a DMA it
        # started knew at its start. What DMAs of one core released to a sync object, not
        # yet joined into `sync_clocks` (`_release_dma`), and each copy's starter.
        self._roots: frozenset[str] = frozenset()
        self._lazy: dict[Hashable, Released] = {}
        self._starter: dict[str, str] = {}
        self._started: dict[str, int] = {}  # DMA in flight -> its fork's number
        self._forks = 0
        self._boxes: set[IndexRange] = set()  # boxes accessed that have elements

    def longest_history(self) -> int:
        """The most access records one buffer's history held at once: bounded by what is
        live, not by the length of the run, when pruning works (CallSummary.races)."""
        return max((history.longest for history in self.history.values()), default=0)

    # -- clocks ------------------------------------------------------------------------
    def clock(self, actor: str) -> VectorClock:
        vc = self.clocks.get(actor)
        if vc is None:
            vc = self.clocks[actor] = VectorClock.starting(self.slot_of.get(actor, actor))
        return vc

    def _tick(self, actor: str) -> None:
        self.clock(actor).tick(self.slot_of.get(actor, actor))

    def fork(self, parent: str, child: str) -> None:
        """`child` (a DMA) starts now: everything `parent` did so far happens before it."""
        parent_vc = self.clocks.get(parent)
        if parent_vc is None:
            parent_vc = self.clock(parent)
        slot, epoch = child, 1
        free = self._free.get(parent)
        if free:
            seen = parent_vc.get
            for i, (old, needed, start) in enumerate(free[:4]):
                if needed <= seen(old, 0):  # parent saw all the old DMA did (has_seen)
                    del free[i]
                    slot, epoch = old, start
                    self.slot_of[child] = old
                    break
        self.clocks[child] = child_vc = VectorClock(parent_vc)  # (parent_vc.forked(...))
        child_vc[slot] = epoch
        self._parent[child] = parent
        self._started[child] = self._forks = self._forks + 1
        if self.live is not None:
            if parent in self.live:
                self.live.add(child)
            else:
                self.live = None  # an actor we were not told of: stop frontier pruning
        own = self.slot_of.get(parent, parent)  # (self._tick(parent), inlined)
        parent_vc[own] = parent_vc.get(own, 0) + 1

    def finish(self, actor: str) -> None:
        """`actor` (a DMA) will not act again: its slot may serve a later DMA."""
        parent = self._parent.pop(actor, None)
        self._started.pop(actor, None)
        vc = self.clocks.get(actor)
        if parent is None or vc is None:
            return
        slot = self.slot_of.get(actor, actor)
        self._free.setdefault(parent, []).append(
            (slot, self._last_epoch.pop(actor, 0), vc[slot] + 1))

    def declare(self, actors: Iterable[str]) -> None:
        """Every root actor of the call (its cores), before any of them acts. From then on
        a record that every live actor has ordered before its clock can race with no later
        access and is dropped (a sweep whenever a buffer's history doubles), so history
        stays bounded by what is live, not by the length of the run."""
        self.live = set(actors)
        self._roots = frozenset(actors)
        for actor in self.live:
            self.clock(actor)

    def end(self, actor: str) -> None:
        """`actor` will access no memory again (a core whose grid ended, a DMA that wrote)."""
        self.finish(actor)  # a DMA's clock slot may serve a later DMA of its starter
        if self.live is not None:
            self.live.discard(actor)

    def _sweep(self, buffer_id: int, history: "History") -> None:
        live = self.live
        assert live is not None
        frontier: dict[str, float] = {}
        for seq, prev in list(history.records.items()):
            known = frontier.get(prev.slot)
            if known is None:
                known = frontier[prev.slot] = min(
                    (self.clocks[x].get(prev.slot, 0) for x in live), default=float("inf"))
            if prev.epoch <= known:
                history.remove(seq)
        history.sweep_at = max(SWEEP_AFTER, 2 * len(history))

    def join_finished(self, actor: str, finished: str) -> None:
        """`actor` waited for `finished` (an ended DMA, such as a pipeline block copy):
        all it did happens before what `actor` does next, and nothing more of it is kept
        (its slot already serves later DMAs), so a long grid's copies cost no memory."""
        vc = self.clocks.pop(finished, None)
        slot = self.slot_of.pop(finished, finished)
        if vc is not None:
            mine = self.clock(actor)
            if self._starter.pop(finished, None) == actor and actor in self._roots:
                # (a copy `actor` started: all else it knew, `actor` knows still)
                if mine.get(slot, 0) < vc[slot]:
                    mine[slot] = vc[slot]
            else:
                mine.join(vc)
            self._joins += 1

    def release(self, actor: str, sync_object: Hashable) -> None:
        """`actor` signals `sync_object` (a semaphore cell, a barrier)."""
        vc = self.clocks.get(actor)
        if vc is None:
            vc = self.clock(actor)
        slot = self.slot_of.get(actor, actor)
        starter = self._parent.get(actor)
        if starter is not None and starter in self._roots:
            self._release_dma(actor, starter, vc, slot, sync_object)
        else:
            self._release_into(sync_object, vc)
        vc.tick(slot)  # (self._tick(actor))

    def _release_into(self, sync_object: Hashable, vc: VectorClock) -> None:
        released = self.sync_clocks.get(sync_object)
        if released is None:
            self.sync_clocks[sync_object] = vc.copy()
        else:
            released.join(vc)

    def _release_dma(self, actor: str, starter: str, vc: VectorClock, slot: str,
                     sync_object: Hashable) -> None:
        """A DMA (or copy) that core `starter` started releases `sync_object`. Its clock is
        what `starter` knew at its start (a DMA joins nothing) and its own slot: kept as
        the latest such clock and the released epochs per slot (`Released`), so that
        `starter`'s wait joins only those epochs instead of every slot (issue 55.4)."""
        lazy = self._lazy.get(sync_object)
        if lazy is not None and lazy.starter != starter:
            self._release_into(sync_object, lazy.clock())
            lazy = None
        if lazy is None:
            lazy = self._lazy[sync_object] = Released(starter)
        lazy.add(vc, slot, vc[slot], self._started[actor])

    def acquire(self, actor: str, sync_object: Hashable) -> None:
        """`actor` waited on `sync_object`: what was released to it happens before now."""
        released = self.sync_clocks.get(sync_object)
        lazy = self._lazy.get(sync_object)
        if released is None and lazy is None:
            return
        mine = self.clock(actor)
        if released is not None:
            mine.join(released)
        if lazy is not None:
            if lazy.starter != actor:  # (`actor` may not know what the starter knew)
                lazy.join_base(mine)
                epochs = lazy.epochs
            elif lazy.joined is mine:  # (it has all epochs released before its last wait)
                epochs = lazy.fresh
            else:
                epochs = lazy.epochs
                lazy.joined = mine
            for slot, epoch in epochs.items():
                if mine.get(slot, 0) < epoch:
                    mine[slot] = epoch
            if lazy.starter == actor:
                lazy.fresh.clear()
        self._joins += 1

    # -- parallel_loop iterations --------------------------------------------------------
    def loop_began(self, actor: str) -> VectorClock:
        """A `parallel_loop` begins in `actor`: what it did so far happens before every
        iteration (the returned clock, each iteration's start); the iterations are
        concurrent with one another (they may overlap or be reordered on the chip)."""
        base = self.clock(actor).copy()
        self._tick(actor)
        return base

    def fork_iteration(self, base: VectorClock, child: str, slot: str) -> None:
        """Iteration `child` starts from `base` in clock entry `slot`. The engine may give
        one slot to several iterations of a long loop (engine/rules/sparsecore.py
        ITERATION_SLOTS apart): each starts after the epochs of the last, so those are
        ordered, and every other pair is not; clocks stay as small as the slots."""
        epoch = max(self._iteration_top.get(slot, 0), base.get(slot, 0)) + 1
        self.clocks[child] = base.forked(slot, epoch)
        self.slot_of[child] = slot
        if self.live is not None:
            self.live.add(child)

    def join_iteration(self, into: VectorClock, child: str) -> None:
        """Iteration `child` ended: its clock joins `into` (what the loop's end knows)."""
        vc = self.clocks.pop(child)
        slot = self.slot_of.pop(child)
        self._iteration_top[slot] = vc[slot]
        into.join(vc)
        if self.live is not None:
            self.live.discard(child)

    def loop_ended(self, actor: str, joined: VectorClock) -> None:
        """The loop ended in `actor`: every iteration happens before what it does next."""
        self.clock(actor).join(joined)
        self._joins += 1

    # -- accesses ----------------------------------------------------------------------
    def on_access(self, event: events.Access) -> None:
        """An actor touched a box of a buffer: races with the unordered accesses before.
        `atomic_add`: an atomic read-modify-write add (a SparseCore scatter-add): two of
        them never race with each other; one races with a plain read or write it is not
        ordered with."""
        actor, buffer_id, buffer, memory_space, index_range, is_write, operation, frames, \
            grid_point, atomic_add = event
        self.checked += 1
        if index_range not in self._boxes:  # (a box met before has elements)
            for lo, hi in index_range:  # no element: it can neither race nor prune
                if hi <= lo:
                    return
            if len(self._boxes) >= 4096:
                self._boxes.clear()
            self._boxes.add(index_range)
        vc = self.clocks.get(actor)
        if vc is None:  # (self.clock(actor), inlined: it runs for every access)
            vc = self.clock(actor)
        slot = self.slot_of.get(actor, actor)
        epoch = vc[slot]
        history = self.history.get(buffer_id)
        if history is None:
            history = self.history[buffer_id] = History()
        else:
            last = history.last
            if (last is not None and last[2] == index_range and last[0] == actor
                    and last[1] == epoch and last[3] == is_write and last[9] == slot
                    and last[10] == atomic_add and history.last_clock is vc
                    and history.last_joins == self._joins):
                # The same box as the buffer's newest record, by the same actor in the
                # same epoch, its clock unchanged, and that record met no race: the full
                # walk would find what it found (nothing), prune that record and add
                # this one in its place (`History.repeat`), so only the frames change.
                history.repeat(_new_record(AccessRecord, (
                    actor, epoch, index_range, is_write, operation, buffer, memory_space,
                    frames, grid_point, slot, atomic_add)))
                self._after_add(actor, epoch, buffer_id, history)
                return
        record = _new_record(AccessRecord, (actor, epoch, index_range, is_write, operation,
                                            buffer, memory_space, frames, grid_point, slot,
                                            atomic_add))
        element = False  # one element (a scalar load or store): a history keyed by them
        if history.cells is not None:
            element = True
            for lo, hi in index_range:
                if hi - lo != 1:
                    element = False
                    break
        raced = history.check(record, element, vc.get)  # (the walk: race_history.py)
        if raced is not None:
            for _, prev, overlap in raced:
                self._race(record, prev, overlap)
        else:  # (what a repeat of this access may skip, above)
            history.last, history.last_clock, history.last_joins = record, vc, self._joins
        # (self._after_add(...), inlined: it runs for every access)
        if actor in self._parent:
            self._last_epoch[actor] = epoch
        if self.live is not None:
            if actor not in self.live:
                self.live = None  # an actor we were not told of: stop frontier pruning
            elif len(history.records) > history.sweep_at:
                self._sweep(buffer_id, history)

    def _after_add(self, actor: str, epoch: int, buffer_id: int, history: History) -> None:
        if actor in self._parent:
            self._last_epoch[actor] = epoch
        if self.live is not None:
            if actor not in self.live:
                self.live = None  # an actor we were not told of: stop frontier pruning
            elif len(history.records) > history.sweep_at:
                self._sweep(buffer_id, history)

    def _race(self, current: AccessRecord, previous: AccessRecord, overlap: IndexRange) -> None:
        where = format_range(overlap)
        message = (f"{current.operation} of {current.buffer}{where} by {current.actor} races"
                   f" with {previous.operation} by {previous.actor}: no semaphore, DMA wait or"
                   f" barrier orders them")
        accesses = (current.as_access(overlap), previous.as_access(overlap))
        self.sink.emit(Finding(
            kind=FindingKind.RACE, message=message, buffer=current.buffer,
            memory_space=current.memory_space, index_range=overlap, frames=current.frames,
            actor=current.actor, grid_point=current.grid_point, accesses=accesses,
            kernel=self.call.kernel, call_index=self.call.call_index, seed=self.call.seed,
            help=race_help(*accesses),
        ))

    def on_accesses_left_out(self, event: AccessesLeftOut) -> None:
        """Accesses the engine left out, of buffers no race can involve: checked all the
        same (CallSummary.races counts them)."""
        self.checked += event.accesses

    # -- the engine's other events, as happens-before edges -------------------------------
    def on_actors_declared(self, event: events.ActorsDeclared) -> None:
        self.declare(event.actors)

    def on_kernel_entered(self, event: events.KernelEntered) -> None:
        """Each device's private memory becomes the kernel's, then its cores rendezvous."""
        for access in event.writes:
            self.on_access(access)
        for actor, device in event.cores:
            self.release(actor, ("kernel entry", device))
        for actor, device in event.cores:
            self.acquire(actor, ("kernel entry", device))

    def on_dma_started(self, event: events.DmaStarted) -> None:
        if not event.carried:  # (one carried in runs alongside the cores from the start)
            self.fork(event.starter, event.actor)

    def on_dma_moved(self, event: events.DmaMoved) -> None:
        for access in event.accesses:
            self.on_access(access)
        if event.signalled is not None:
            if event.landed and self._landed(event.actor, event.signalled.key):
                return
            self.release(event.actor, event.signalled.key)
        if event.landed:
            self.end(event.actor)

    def _landed(self, actor: str, sync_object: Hashable) -> bool:
        """A DMA a call's core started landed and signals `sync_object`: `release` then
        `end`, in one (one per DMA: a paged attention call has a hundred). False, having
        done nothing, for any other DMA."""
        parent = self._parent.get(actor)
        vc = self.clocks.get(actor)
        lazy = self._lazy.get(sync_object)
        if (parent is None or vc is None or parent not in self._roots or lazy is None
                or lazy.starter != parent):
            return False
        slot = self.slot_of.get(actor, actor)
        epoch = vc[slot]
        lazy.add(vc, slot, epoch, self._started.pop(actor))  # (`_release_dma`)
        vc[slot] = epoch + 1  # (`vc.tick(slot)`)
        del self._parent[actor]  # (`finish`: its slot may serve a later DMA of `parent`)
        self._free.setdefault(parent, []).append(
            (slot, self._last_epoch.pop(actor, 0), epoch + 2))
        if self.live is not None:
            self.live.discard(actor)
        return True

    def on_signalled(self, event: events.Signalled) -> None:
        self.release(event.actor, event.cell.key)

    def on_waited(self, event: events.Waited) -> None:
        self.acquire(event.actor, event.cell.key)

    def on_core_done(self, event: events.CoreDone) -> None:
        self.end(event.actor)  # the core's grid is done: it accesses nothing more

    def on_serial_start(self, event: SerialStart) -> None:
        """A core of a mesh run one core after another begins (engine/call/serial.py):
        everything the core before it did happens before it, so the two never race."""
        self.clock(event.actor).join(self.clock(event.after))

    def on_copy_started(self, event: events.CopyStarted) -> None:
        self.fork(event.actor, event.name)
        self._starter[event.name] = event.actor  # (`join_finished` asks)

    def on_copy_moved(self, event: events.CopyMoved) -> None:
        if event.access is not None:
            self.on_access(event.access)
        self.end(event.name)

    def on_copy_waited(self, event: events.CopyWaited) -> None:
        self.join_finished(event.actor, event.name)

    # SparseCore: the subcore barrier, parallel_loop iterations.
    def on_subcore_barrier(self, event: events.AtBarrier) -> None:
        """All each subcore did before arriving at a barrier generation happens before all
        any does after going through it."""
        key = ("sparsecore barrier", event.device, event.sparsecore, event.generation)
        if event.passed:
            self.acquire(event.actor, key)
        else:
            self.release(event.actor, key)

    def on_parallel_loop(self, event: events.ParallelLoop) -> None:
        if event.began:
            self._loops.setdefault(event.actor, []).append(
                (self.loop_began(event.actor), VectorClock()))
        else:
            _, joined = self._loops[event.actor].pop()
            self.loop_ended(event.actor, joined)

    def on_loop_iteration(self, event: events.LoopIteration) -> None:
        base, joined = self._loops[event.loop][-1]
        if event.began:
            self.fork_iteration(base, event.actor, event.slot)
        else:
            self.join_iteration(joined, event.actor)
