"""The plain data of the engine's events (engine/events.py), built from its objects.

Only the engine reads its buffers, regions and DMAs; a listener gets names, ranges and
frames. These builders run only where some listener takes the event (see `Feeds`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, NamedTuple

import numpy as np

from pallas_check.engine.events import (Access, Cell, DmaMoved, DmaStarted, event_kind,
                                        make_access)
from pallas_check.engine.verdicts import (AbsentSubcore, BlockedWait, Deadlocked, DmaNotWaited,
                                          SemaphoreLeft, SerialCores, StalledBarrier, Where)
from pallas_check.engine.call.serial import SERIAL_START
from pallas_check.engine.dma.engine import CellKey, Runner, SemCell, sem_name, sem_value
from pallas_check.engine.memory.region import Region
from pallas_check.engine.runtime.barrier import SubcoreBarrier
from pallas_check.findings.finding import SourceFrame

_new = tuple.__new__  # (an event from its fields in order: a NamedTuple's constructor is a
#                      Python function taking keywords and defaults; these run per DMA)

if TYPE_CHECKING:  # only for annotations
    from pallas_check.engine.dma.engine import Dma, SyncState
    from pallas_check.engine.memory.buffer import Buffer
    from pallas_check.engine.runtime.scheduler import Deadlock, Scheduler, Wait


@event_kind
class AccessesLeftOut(NamedTuple):
    """At the end of a run: how many accesses of buffers no race can involve were left
    out of the access feed (engine/call/unraced.py; the race checker counts them as
    checked, so `accesses_checked` is what it was)."""

    accesses: int


# Who runs (state.py's CoreContext): the DMA wing's `Runner`.
Core = Runner


def cell(semaphore: SemCell) -> Cell:
    """A semaphore cell (buffer, index) as plain data."""
    buf, idx = semaphore
    return Cell((buf.id, tuple(int(i) for i in idx)), buf.name, buf.device)


class Cells:
    """Semaphore cells as plain data, each made once per call: a DMA's receive cell is
    named at its start, at its landing and at each wait on it (with races on, hundreds
    of times in a paged kernel's call)."""

    __slots__ = ("_made",)

    def __init__(self) -> None:
        self._made: dict[tuple[int, tuple[int, ...]], Cell] = {}

    def __call__(self, semaphore: SemCell) -> Cell:
        buf, idx = semaphore
        key = (buf.id, idx)
        made = self._made.get(key)
        if made is None:
            made = self._made[key] = cell(semaphore)
        return made


def where(ctx: Core, frames: tuple[SourceFrame, ...]) -> Where:
    return Where(ctx.actor, ctx.device_id, ctx.core_id, ctx.grid_point, frames)


def accesses(actor: str, region: Region, is_write: bool, operation: str,
             frames: tuple[SourceFrame, ...],
             grid_point: tuple[int, ...] | None) -> tuple[Access, ...]:
    """One access per box (one box unless seen through a reshape or bitcast)."""
    buf = region.buffer
    boxes = region.boxes()
    if len(boxes) == 1:  # (the commonest: no generator)
        return (make_access((actor, buf.id, buf.name, buf.space, boxes[0], is_write,
                             operation, frames, grid_point, False)),)
    return tuple(Access(actor, buf.id, buf.name, buf.space, box, is_write, operation, frames,
                        grid_point) for box in boxes)


def dma_started(ctx: Core, dma: Dma, carried: bool = False,
                cells: Callable[[SemCell], Cell] = cell) -> DmaStarted:
    return _new(DmaStarted, (dma.id, dma.actor_name, ctx.actor, ctx.device_id, ctx.core_id,
                             dma.src.buffer.name, dma.dst.buffer.name, dma.nbytes,
                             dma.frames, dma.dst.buffer.device, cells(dma.dst_sem), carried,
                             bool(dma.read_done)))


def dma_moved(dma: Dma, landed: bool, cells: Callable[[SemCell], Cell] = cell,
              unraced: bool = False) -> DmaMoved:
    """The DMA's read (with its send semaphore) or its write (its receive semaphore);
    `unraced`: no race can involve its source, whose read is left out."""
    name = dma.actor_name  # (a property: read once)
    if landed:
        moved = accesses(name, dma.dst, True, "DMA write", dma.frames, dma.grid_point)
        if dma.atomic_add:  # a SparseCore scatter-add: atomic read-modify-writes
            moved = tuple(a._replace(operation="DMA add", atomic_add=True) for a in moved)
        return _new(DmaMoved, (dma.id, name, True, moved, cells(dma.dst_sem), False))
    moved = () if unraced else accesses(name, dma.src, False, "DMA read", dma.frames,
                                        dma.grid_point)
    return _new(DmaMoved, (dma.id, name, False, moved,
                           cells(dma.src_sem) if dma.src_sem is not None else None, False))


def owed(sync: SyncState, semaphore: SemCell) -> tuple[int, ...]:
    """The DMAs on a semaphore cell not yet fully waited (in start order)."""
    queue = sync._unwaited.get((semaphore[0].id, semaphore[1]), ())
    return tuple(d.id for d in queue if d.waited_bytes < d.signal)


def blocked_wait(actor: str, wait: Wait) -> BlockedWait:
    current = wait.current() if callable(wait.current) else wait.current
    if getattr(wait, "cell", None) is None:
        buffer, rng = wait.semaphore, None
    else:
        buf, idx = wait.cell
        buffer, rng = buf.name, tuple((int(i), int(i) + 1) for i in idx) or None
    if isinstance(current, SubcoreBarrier):  # a SparseCore's subcore barrier
        return BlockedWait(actor, wait.what, wait.semaphore, wait.wanted, current.waiting(),
                           buffer, rng, tuple(wait.frames), current.where)
    assert current is not None  # (a wait that blocks on a count says what it is)
    return BlockedWait(actor, wait.what, wait.semaphore, wait.wanted, int(current), buffer,
                       rng, tuple(wait.frames))


def deadlocked(deadlock: Deadlock, scheduler: Scheduler,
               grid_point: tuple[int, ...] | None,
               serial: SerialCores | None = None) -> Deadlocked:
    """Every blocked actor, and each subcore barrier some wait at with who never arrives
    there (and what it does instead). `serial`: the call's mesh runs its cores one after
    another (engine/call/serial.py); a core still waiting for the one before it to end
    never started, and is listed so rather than as a wait."""
    blocked = [(actor, wait) for actor, wait in deadlock.blocked if wait.what != SERIAL_START]
    if serial is not None:
        serial = serial._replace(not_started=tuple(
            actor for actor, wait in deadlock.blocked if wait.what == SERIAL_START))
    barriers: dict[int, tuple[SubcoreBarrier, list[str]]] = {}
    for actor, wait in blocked:
        current = wait.current() if callable(wait.current) else wait.current
        if isinstance(current, SubcoreBarrier):
            barriers.setdefault(id(current), (current, []))[1].append(actor)
    actors = {a.name: a for a in scheduler.actors}
    stalled = []
    for barrier, waiting in barriers.values():
        absent = []
        for subcore, name in barrier.missing():
            runner = actors.get(name)
            finished = runner is not None and runner.done
            waits = runner.waiting if runner is not None and not finished else None
            absent.append(AbsentSubcore(subcore, name, finished, "" if waits is None
                                        else f"{waits.what} ({waits.semaphore})"))
        frames = next(iter(barrier.arrived.values()), ())
        stalled.append(StalledBarrier(barrier.where, len(barrier.members), tuple(waiting),
                                      frames[0].line if frames else None, tuple(absent)))
    return Deadlocked(tuple(blocked_wait(actor, wait) for actor, wait in blocked),
                      grid_point, tuple(stalled), serial)


def semaphores_left(sync: SyncState, semaphores: list[Buffer]) -> tuple[SemaphoreLeft, ...]:
    """Every semaphore cell with a count at kernel end, with what DMAs never waited on it
    explain of it and where it was last signalled."""
    unwaited: dict[CellKey, int] = {}
    for dma in sync.dmas:
        key = (dma.dst_sem[0].id, dma.dst_sem[1])
        unwaited[key] = unwaited.get(key, 0) + dma.signal - dma.waited_bytes
    left = []
    for buf in semaphores:
        for idx in zip(*np.nonzero(buf.data)) if buf.data.ndim else [()]:
            idx = tuple(int(i) for i in idx)
            count = int(buf.data[idx])
            if count == 0:
                continue
            left.append(SemaphoreLeft(
                buf.name, sem_name((buf, idx)), idx, buf.device, count,
                unwaited.get((buf.id, idx), 0), sync.last_signal.get((buf.id, idx), ()),
                sync.last_signaller.get((buf.id, idx), "")))
    return tuple(left)


def dmas_not_waited(sync: SyncState) -> list[DmaNotWaited]:
    """Every DMA whose bytes were never (fully) taken off its semaphore by a wait."""
    found = []
    for dma in sync.dmas:
        if dma.waited_bytes >= dma.signal:
            continue
        sem = cell(dma.dst_sem)
        origin = (dma.origin[0], dma.origin[1].name) if dma.origin is not None else None
        found.append(DmaNotWaited(
            dma.id, dma.src.buffer.name, dma.src.index_range(), dma.dst.buffer.name,
            dma.dst.index_range(), dma.dst.buffer.space, dma.nbytes, dma.waited_bytes,
            sem.name, sem_value(dma.dst_sem), origin, dma.actor,
            dma.grid_point, dma.frames, dma.signal))
    return found
