"""engine/dma/engine.py's state machines on their own: a DMA and the semaphores it signals.

On a TPU a DMA is two events. It reads its source, which signals its send semaphore (the
sender's `wait_send`: the source may be reused), then its data lands in the destination,
which signals the receive semaphore (`wait_recv`). A DMA semaphore counts bytes: each
event adds the DMA's byte count and a wait takes off the bytes of its descriptor; a
regular semaphore signalled by a DMA (TPU v6+) counts one per DMA. In `on_wait` mode a
wait whose semaphore is short lands the DMAs in flight that signal it, newest first, until
it holds what the wait wants (DMAs sharing a semaphore may land in any order on a TPU;
newest first breaks a kernel that relies on first-in, first-out).

The events are driven by hand here, with a stand-in for the call they report to."""

from __future__ import annotations

import numpy as np
import pytest

from pallas_check.engine.dma.policy import policy_for
from pallas_check.config import DmaMode
from pallas_check.engine.dma.engine import (Dma, SyncState, cell_of, complete, dma_read,
                                            dma_write, sem_name, sem_value)
from pallas_check.engine.jaxpr.halts import KernelError
from pallas_check.engine.memory.buffer import Buffer, MemorySpace, fill_value
from pallas_check.engine.memory.region import Region, index_region

NBYTES = 8 * 128 * 4  # an (8, 128) f32 block


class StubCall:
    """What the DMA state machines tell the call: the events, in order."""

    def __init__(self) -> None:
        self.sync = SyncState()
        self.events: list[tuple[str, int]] = []
        self.unwritten_copies: list[np.ndarray] = []

    def on_dma_read(self, ctx, dma: Dma) -> None:
        self.events.append(("read", dma.id))

    def on_dma_write(self, ctx, dma: Dma) -> None:
        self.events.append(("write", dma.id))

    def dma_copied_unwritten(self, dma: Dma, unwritten: np.ndarray) -> None:
        self.unwritten_copies.append(unwritten)


class StubContext:
    """A core's context as the DMA events use it: its call and the fill of unwritten memory."""

    def __init__(self) -> None:
        self.call = StubCall()
        self.eqn = None  # no equation being evaluated: errors carry no source line
        self.frame_stack: list = []

    def fill(self, dtype):
        return fill_value(dtype, "nan")


def semaphores(n: int = 2) -> Buffer:
    return Buffer("sems", MemorySpace.SEMAPHORE, np.zeros((n,), np.int64), True)


def whole(buffer: Buffer) -> Region:
    return index_region(buffer, [])


def block(name: str, space: str, value: float | None = None) -> Buffer:
    if value is None:
        return Buffer.filled(name, space, (8, 128), np.float32, "nan")
    return Buffer(name, space, np.full((8, 128), value, np.float32), True)


def make_dma(ctx: StubContext, src: Buffer, dst: Buffer, recv: tuple, send: tuple | None = None,
             signal: int = NBYTES) -> Dma:
    """A started DMA (as rules/dma.py's start makes one): `signal` is its bytes on DMA
    semaphores, 1 on regular ones."""
    sync = ctx.call.sync
    dma = Dma(sync.next_id(), whole(src), whole(dst), recv, send, NBYTES, "core 0", (), None,
              signal)
    sync.start(dma)
    return dma


def cell(sems: Buffer, i: int) -> tuple:
    return cell_of(None, index_region(sems, [(i,)]))


def test_a_read_signals_the_send_semaphore_and_stages_the_source():
    ctx, sems = StubContext(), semaphores()
    src, dst = block("x", MemorySpace.HBM, 1.0), block("buf", MemorySpace.VMEM)
    recv, send = cell(sems, 0), cell(sems, 1)
    dma = make_dma(ctx, src, dst, recv, send)
    dma_read(ctx, dma)
    assert dma.read_done and not dma.copied
    assert (sem_value(send), sem_value(recv)) == (NBYTES, 0)
    assert np.isnan(dst.data).all() and not dst.written.any()  # nothing has landed
    whole(src).write_base(np.full((8, 128), 9.0, np.float32))  # the source reused
    dma_write(ctx, dma)
    assert (dst.data == 1.0).all() and dst.fully_written  # the values read, not the new ones
    assert (sem_value(send), sem_value(recv)) == (NBYTES, NBYTES)
    assert ctx.call.events == [("read", dma.id), ("write", dma.id)]


def test_each_event_happens_once():
    ctx, sems = StubContext(), semaphores()
    dma = make_dma(ctx, block("x", MemorySpace.HBM, 1.0), block("buf", MemorySpace.VMEM),
                   cell(sems, 0), cell(sems, 1))
    complete(ctx, dma)  # a landing reads first
    complete(ctx, dma)
    dma_read(ctx, dma)
    dma_write(ctx, dma)
    assert ctx.call.events == [("read", dma.id), ("write", dma.id)]
    assert (sem_value(cell(sems, 0)), sem_value(cell(sems, 1))) == (NBYTES, NBYTES)


def test_a_regular_semaphore_counts_one_per_dma():
    ctx, sems = StubContext(), semaphores()
    recv, send = cell(sems, 0), cell(sems, 1)
    for _ in range(3):
        complete(ctx, make_dma(ctx, block("x", MemorySpace.HBM, 1.0),
                               block("buf", MemorySpace.VMEM), recv, send, signal=1))
    assert (sem_value(recv), sem_value(send)) == (3, 3)


def test_a_dma_without_a_send_semaphore_signals_only_its_landing():
    ctx, sems = StubContext(), semaphores()
    complete(ctx, make_dma(ctx, block("x", MemorySpace.HBM, 1.0),
                           block("buf", MemorySpace.VMEM), cell(sems, 0)))
    assert list(sems.data) == [NBYTES, 0]


def test_the_source_shadow_travels_with_the_data():
    """Never-written source elements land as never-written in a scratch destination; in an
    output they are reported at the DMA (whose read reached the output) and marked written."""
    ctx, sems = StubContext(), semaphores()
    src = block("s", MemorySpace.VMEM)
    src.mark_written((slice(0, 4), slice(None)))
    scratch = block("buf", MemorySpace.VMEM)
    complete(ctx, make_dma(ctx, src, scratch, cell(sems, 0)))
    assert scratch.written[:4].all() and not scratch.written[4:].any()
    assert ctx.call.unwritten_copies == []

    out = block("o", MemorySpace.HBM)
    out.is_output = True
    complete(ctx, make_dma(ctx, src, out, cell(sems, 1)))
    [unwritten] = ctx.call.unwritten_copies
    assert not unwritten[:4].any() and unwritten[4:].all()
    assert out.fully_written


def test_pending_on_lists_the_events_still_to_come_newest_dma_first():
    ctx, sems = StubContext(), semaphores()
    shared = cell(sems, 0)
    landing = make_dma(ctx, block("a", MemorySpace.HBM, 1.0), block("b", MemorySpace.VMEM),
                       shared)
    sending = make_dma(ctx, block("c", MemorySpace.VMEM, 1.0), block("d", MemorySpace.HBM),
                       cell(sems, 1), shared)  # signals `shared` when it reads its source
    third = make_dma(ctx, block("e", MemorySpace.HBM, 1.0), block("f", MemorySpace.VMEM),
                     shared)
    sync = ctx.call.sync
    assert sync.landing_only(shared) is None  # a send semaphore too: both kinds count
    assert [(d.id, lands) for d, lands in sync.pending_on(shared)] == [
        (third.id, True), (sending.id, False), (landing.id, True)]
    dma_read(ctx, sending)
    complete(ctx, third)
    assert [(d.id, lands) for d, lands in sync.pending_on(shared)] == [(landing.id, True)]
    assert [d.id for d in sync.landing_only(cell(sems, 1))] == [sending.id]


def land_on_wait(ctx: StubContext, sem: tuple, wanted: int) -> None:
    """What a wait in `on_wait` mode makes happen when `sem` holds less than `wanted`."""
    policy_for(DmaMode.ON_WAIT).land_for(ctx, ctx.call.sync, sem, wanted)


def test_on_wait_lands_the_newest_dma_first_and_only_what_the_wait_needs():
    ctx, sems = StubContext(), semaphores()
    recv = cell(sems, 0)
    dsts = [block(f"buf{i}", MemorySpace.VMEM) for i in range(3)]
    dmas = [make_dma(ctx, block(f"x{i}", MemorySpace.HBM, float(i)), dst, recv)
            for i, dst in enumerate(dsts)]
    land_on_wait(ctx, recv, NBYTES)
    assert [d.copied for d in dmas] == [False, False, True]
    assert sem_value(recv) == NBYTES
    land_on_wait(ctx, recv, 2 * NBYTES)
    assert [d.copied for d in dmas] == [False, True, True]
    assert (dsts[1].data == 1.0).all() and np.isnan(dsts[0].data).all()
    land_on_wait(ctx, recv, 2 * NBYTES)  # already there: nothing more lands
    assert not dmas[0].copied


def test_on_wait_reads_a_source_for_a_send_semaphore_without_landing_it():
    ctx, sems = StubContext(), semaphores()
    recv, send = cell(sems, 0), cell(sems, 1)
    remote = make_dma(ctx, block("x", MemorySpace.VMEM, 1.0), block("y", MemorySpace.HBM),
                      recv, send)
    land_on_wait(ctx, send, NBYTES)
    assert remote.read_done and not remote.copied
    assert (sem_value(send), sem_value(recv)) == (NBYTES, 0)


def test_a_semaphore_access_must_pick_one_semaphore():
    sems = semaphores(4)
    assert sem_name(cell(sems, 2)) == "sems[2]"
    with pytest.raises(KernelError, match="must pick one semaphore"):
        cell_of(StubContext(), index_region(sems, [((0, 2, 1),)]))


def test_the_dma_a_read_came_before_is_the_newest_not_landed_over_its_elements():
    """`landing_into`: what a read of never-written memory names as the DMA whose wait it
    came before (issue 36): only a DMA into that buffer, over the elements read, that has
    not landed; the newest of several."""
    ctx, sems = StubContext(), semaphores()
    buf, other = block("buf", MemorySpace.VMEM), block("other", MemorySpace.VMEM)
    first = make_dma(ctx, block("x", MemorySpace.HBM, 1.0), buf, cell(sems, 0))
    sync = ctx.call.sync
    rows = ((0, 8), (0, 128))
    assert sync.landing_into(buf.id, rows) is first
    assert sync.landing_into(other.id, rows) is None  # another buffer
    second = make_dma(ctx, block("y", MemorySpace.HBM, 2.0), buf, cell(sems, 1))
    assert sync.landing_into(buf.id, ((4, 5), (0, 1))) is second  # the newest in flight
    complete(ctx, second)
    assert sync.landing_into(buf.id, rows) is first  # landed: no longer in flight
    complete(ctx, first)
    assert sync.landing_into(buf.id, rows) is None
    # A DMA into a part of the buffer does not explain a read of another part.
    part = Dma(sync.next_id(), whole(block("z", MemorySpace.HBM, 3.0)),
               index_region(buf, [((0, 4, 1), (0, 128, 1))]), cell(sems, 0), None, NBYTES // 2,
               "core 0", (), None, NBYTES // 2)
    sync.start(part)
    assert sync.landing_into(buf.id, ((4, 8), (0, 128))) is None
    assert sync.landing_into(buf.id, ((3, 8), (0, 128))) is part
