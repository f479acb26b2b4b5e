"""Semaphores as values of the program: what a semaphore carries from one pallas_call to
the next.

A pallas_call may return a semaphore (`pltpu.SemaphoreType.DMA(())` as an out_shape, its
BlockSpec in `pltpu.SEMAPHORE`) and a later call may take it as an input: JAX's "start the
copy in one kernel, wait in the next". On a TPU the semaphore keeps its count and the DMAs
that will still signal it; here XLA holds it as an int32 array (its physical type), each
element a handle to a `SemaphoreValue` kept in the session's `carried` dict. The values are
never changed once made (a schedule that is not kept, or a second-fill run, must not touch
what the kept schedule sees); a call that takes a semaphore marks its handle taken, and a
handle never taken by the end of the script is checked then.

A DMA in flight when its call ends lands, in values, into the call's output right then: the
output XLA passes on is right whatever the next call does. What the next call sees is the
DMA still in flight: it lands (by the DMA mode) and signals there, a wait there takes its
bytes, and where its destination is found among the next call's operands (on one CPU
device, the same XLA buffer) its region holds the values from before the landing until it
lands, so that a read before the wait is a race (and sees no landed data).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Sequence

import numpy as np

from pallas_check.engine.call.state import CallState, CoreContext
from pallas_check.engine.dma.engine import CellKey, Dma, SemCell, complete, sem_add, sem_name
from pallas_check.engine.memory.buffer import Buffer, IndexDim, MemorySpace
from pallas_check.jaxbridge.types import Transform
from pallas_check.engine.memory.region import OutOfBounds, Region
from pallas_check.findings.finding import IndexRange, KernelInfo, SourceFrame


_handles = itertools.count(1)  # 0: a semaphore with nothing to carry (count 0, no DMAs)

# A DMA side as a later call rebuilds it: its buffer's name, its range, and its region's
# dims, post transforms and out-of-bounds parts.
Described = tuple[str, IndexRange, list[IndexDim], list[Transform], list[OutOfBounds]]


@dataclasses.dataclass(frozen=True)
class CarriedDma:
    """A DMA still to signal a semaphore when the call that started it ended: `lands`, it
    has still to land (the semaphore is its receive semaphore); else it has still to read
    its source (its send semaphore)."""

    lands: bool
    nbytes: int
    signal: int  # what it adds to (and waits take off) its semaphore: bytes, or 1 (regular)
    landed_already: bool  # it landed before its call ended (its bytes are in the count)
    waited_bytes: int
    src: Described  # name, range, dims, post, oob
    dst: Described
    frames: tuple[SourceFrame, ...]
    starter: str  # the actor that started it, in its call
    grid_point: tuple[int, ...] | None
    call_index: int
    kernel: KernelInfo
    # Where it lands, to find it in a later call: the address of the XLA buffer of the
    # output it lands in (None: not an output there is an address for), that buffer's shape
    # and dtype, and the region's values and shadow before the landing and its values after.
    dst_address: int | None = None
    dst_layout: tuple[tuple[int, ...], str] | None = None
    before: tuple[np.ndarray, np.ndarray] | None = None
    landed: np.ndarray | None = None

    @property
    def origin(self) -> str:
        return f"call #{self.call_index} ({self.kernel.name})"


@dataclasses.dataclass(frozen=True)
class SemaphoreValue:
    """One semaphore as a call returned it: its count, the DMAs still to signal it, and
    who returned it (for what the end of the script reports)."""

    count: int
    dmas: tuple[CarriedDma, ...]
    name: str
    call_index: int
    kernel: KernelInfo
    device: int
    last_signal: tuple[SourceFrame, ...] = ()  # where a kernel last signalled it
    last_signaller: str = ""


def _key(handle: object) -> tuple[str, object]:
    return ("semaphore", handle)


def _taken_key(handle: object) -> tuple[str, object]:
    return ("semaphore taken", handle)


def semaphore_in(state: CallState, name: str, handles: np.ndarray, device: int) -> Buffer:
    """A semaphore input of the call: its counts from the values its handles name (an
    unknown handle is a fresh semaphore); the DMAs they carry arrive in `arrive`."""
    handles = np.asarray(handles)
    counts = np.zeros(handles.shape, np.int64)
    buf = Buffer(name, MemorySpace.SEMAPHORE, counts, True)
    for idx in np.ndindex(*handles.shape):
        handle = int(handles[idx])
        value = state.carried.get(_key(handle)) if handle else None
        if not isinstance(value, SemaphoreValue):  # (none: a fresh semaphore)
            continue
        state.carried[_taken_key(handle)] = True
        counts[idx] = value.count
        if value.last_signal:
            state.sync.last_signal[(buf.id, idx)] = value.last_signal
            state.sync.last_signaller[(buf.id, idx)] = value.last_signaller
        if value.dmas:
            state.arriving.append((buf, idx, value))
    return buf


def arrive(state: CallState, ctx_of: dict[int, CoreContext],
           addresses: dict[int, tuple[dict[int, Buffer], list[Buffer]]]) -> list[Dma]:
    """The DMAs the call's semaphore inputs carry, as DMAs of this call still in flight
    (`addresses`: per device, its HBM inputs by operand address (one CPU device) and all
    of them, where a landing may be found). Returns them (the caller makes them actors in
    `random` mode)."""
    made = []
    for buf, idx, value in state.arriving:
        for carried in value.dmas:
            dma = _arriving_dma(state, ctx_of[buf.device], (buf, idx), carried,
                                addresses.get(buf.device, ({}, [])))
            state.sync.start(dma)
            if not dma.copied or dma in state.carried_landed:
                # --trace: its track from this call's start (past its read if read)
                state.on_dma_start(ctx_of[buf.device], dma, carried=True)
            made.append(dma)
    state.arriving.clear()
    state.carried_dmas[:] = made
    return made


def _arriving_dma(state: CallState, ctx: CoreContext, cell: SemCell, carried: CarriedDma,
                  candidates: tuple[dict[int, Buffer], list[Buffer]]) -> Dma:
    src = _stub_region(carried.src)
    dst = _landing_region(state, carried, candidates) if carried.lands else None
    followed = dst is not None
    if dst is None:
        dst = _stub_region(carried.dst)
    if carried.lands:
        dst_sem, src_sem = cell, None
    else:  # its landing is another semaphore's business (checked where that one ends)
        dst_sem = (Buffer("(landing semaphore)", MemorySpace.SEMAPHORE,
                          np.zeros((), np.int64), True), ())
        src_sem = cell
    dma = Dma(state.sync.next_id(), src, dst, dst_sem, src_sem, carried.nbytes,
                   f"{carried.starter} in {carried.origin}", carried.frames,
                   carried.grid_point, carried.signal)
    dma.origin = (carried.call_index, carried.kernel, carried.starter)
    if carried.landed_already:
        dma.read_done = dma.copied = True
        dma.waited_bytes = carried.waited_bytes
        if followed:  # it landed before this call: a write unordered with its accesses
            state.carried_landed.append(dma)
    elif carried.lands:
        dma.read_done = True  # read when its call ended: what lands is already known
        dma.staged = (np.array(carried.landed), True) if carried.landed is not None else (
            np.zeros(dst.out_shape, dst.buffer.data.dtype), True)
        dma.waited_bytes = carried.waited_bytes
    else:
        dma.waited_bytes = carried.signal
    return dma


class _Elsewhere(Region):
    """A region of a buffer that is not this call's (a DMA's source or destination in the
    call that started it): a small buffer of the region's own size, named as that one
    (findings and race reports give its range there; nothing here can touch it)."""

    __slots__ = ("_range",)
    _range: IndexRange  # its range there (`_describe`: a Region's index_range())

    def index_range(self) -> IndexRange:
        return self._range

    def boxes(self) -> tuple[IndexRange, ...]:
        return (self._range,) if self._range else ()


def _stub_region(described: Described) -> Region:
    name, rng, _, _, _ = described
    shape = tuple(hi - lo for lo, hi in rng) if rng else ()
    stub = Buffer(name, MemorySpace.HBM, np.zeros(shape, np.float32), True)
    region = _Elsewhere(stub, [(0, n, 1) for n in shape], [], [])
    region._range = rng
    return region


def _landing_region(state: CallState, carried: CarriedDma,
                    candidates: tuple[dict[int, Buffer], list[Buffer]]) -> Region | None:
    """The region the DMA lands in among this call's inputs, restored to what it held
    before the landing (None: not found, the landing is not followed here). The input is
    the XLA buffer the DMA's output was returned in (one CPU device lends them); else the
    one input, of its shape and type, that holds what landed there (several: none)."""
    if carried.landed is None or carried.dst_layout is None:
        return None
    by_address, inputs = candidates
    region = None
    if carried.dst_address is not None:
        region = _holding(carried, [by_address.get(carried.dst_address)])
    if region is None:
        region = _holding(carried, inputs)
    if region is None:
        return None
    if not carried.landed_already and carried.before is not None:
        # Until it lands, the region holds what it held before (never-written elements
        # as this run's fill, so that the second-fill run sees where they go).
        values, written = carried.before
        fill = state.fill(values.dtype)
        region.write_base(np.where(written, values, fill), written)
    return region


def _holding(carried: CarriedDma, buffers: Sequence[Buffer | None]) -> Region | None:
    """The region of the one buffer among `buffers` that holds what the DMA landed
    (None: no buffer, or several: the landing is not followed)."""
    assert carried.landed is not None
    _, _, dims, post, oob = carried.dst
    want = carried.landed.tobytes()
    found = [region for region in (Region(buf, dims, post, oob) for buf in buffers
                                   if buf is not None
                                   and (buf.shape, buf.data.dtype.str) == carried.dst_layout)
             if np.asarray(region.read_base(0)).tobytes() == want]
    return found[0] if len(found) == 1 else None


def depart(state: CallState, ctx: CoreContext, outputs: list[tuple[Buffer, int | None]],
           mirrors: dict[int, Buffer]) -> dict[CellKey, list[CarriedDma]]:
    """At the call's end: the DMAs in flight that signal a semaphore the call returns
    (`outputs`: the call's output buffers, each with the address of its XLA buffer) are
    carried by it. Each lands now in values (in a whole-output VMEM block: in the output
    too, `mirrors`), its bytes left off the semaphore's count; returns cell -> the
    CarriedDmas it carries."""
    sem_ids = {buf.id for buf, _ in outputs if buf.space == MemorySpace.SEMAPHORE}
    addresses = {buf.id: address for buf, address in outputs
                 if buf.space != MemorySpace.SEMAPHORE}
    carried: dict[CellKey, list[CarriedDma]] = {}
    kept = []
    for dma in state.sync.dmas:
        returned = dma.dst_sem[0].id in sem_ids
        if returned and dma.copied and dma.waited_bytes < dma.signal:
            # Landed, its bytes in the count: a later call's wait takes them (and orders
            # that call's accesses of the destination after the landing).
            _mirror(dma, mirrors, landed=True)
            carried.setdefault(_cell_key(dma.dst_sem), []).append(_carried(
                state, dma, True, _followed(dma, addresses), landed=True))
            continue
        lands = not dma.copied and returned
        reads = (not dma.read_done and dma.src_sem is not None
                 and dma.src_sem[0].id in sem_ids)
        if not (lands or reads):
            kept.append(dma)
            continue
        follow = _followed(dma, addresses) if lands else None
        before = ((np.array(dma.dst.read_base(0)), np.array(dma.dst.written_base()))
                  if follow is not None else None)
        complete(ctx, dma)
        if lands:
            _mirror(dma, mirrors)
            sem_add(dma.dst_sem, -dma.signal)
            carried.setdefault(_cell_key(dma.dst_sem), []).append(_carried(
                state, dma, True, follow, before))
        else:
            kept.append(dma)  # its landing is this call's, and checked here
        if reads and dma.src_sem is not None:  # (`reads` says it has one)
            sem_add(dma.src_sem, -dma.signal)
            carried.setdefault(_cell_key(dma.src_sem), []).append(
                _carried(state, dma, False, None))
    state.sync.keep_only(kept)
    return carried


def _followed(dma: Dma, addresses: dict[int, int | None]) -> tuple[int | None] | None:
    """Whether a later call may find where `dma` lands: in an output the call returns,
    plainly indexed; then (the address of that output's XLA buffer, or None), else None."""
    if (dma.dst.buffer.id not in addresses or dma.dst.post or dma.dst.oob
            or dma.dst.padded):  # past the shape: not plainly indexed
        return None
    return (addresses[dma.dst.buffer.id],)


def _mirror(dma: Dma, mirrors: dict[int, Buffer], landed: bool = False) -> None:
    """A landing in a whole-output VMEM block after the kernel's write-back: the output
    the call returns holds it too (on a TPU that output is the VMEM buffer itself). One
    that `landed` already did so before the write-back if the output holds it written
    (the block's array went to the write-back then; the block holds nothing since)."""
    mirror = mirrors.get(dma.dst.buffer.id)
    if mirror is None or dma.dst.post or dma.dst.padded:
        return
    region = Region(mirror, list(dma.dst.dims), [], list(dma.dst.oob))
    if landed and np.all(region.written_base()):
        return
    region.write_base(dma.dst.read_base(0), dma.dst.written_base())


def _cell_key(cell: SemCell) -> CellKey:
    return (cell[0].id, tuple(int(i) for i in cell[1]))


def _describe(region: Region) -> Described:
    return (region.buffer.name, region.index_range(), list(region.dims), list(region.post),
            list(region.oob))


def _carried(state: CallState, dma: Dma, lands: bool, follow: tuple[int | None] | None,
             before: tuple[np.ndarray, np.ndarray] | None = None,
             landed: bool = False) -> CarriedDma:
    """What a semaphore the call returns carries of `dma` (started here, or arrived from
    an earlier call and passed on: then it keeps the call that started it). `follow`
    (`_followed`): its landing can be followed into the next call; `landed`: it landed
    before this call ended (else `before`: its destination's values and shadow then)."""
    call_index, kernel, starter = dma.origin or (state.call_index, state.kernel, dma.actor)
    return CarriedDma(
        lands, dma.nbytes, dma.signal, landed, dma.waited_bytes, _describe(dma.src),
        _describe(dma.dst), dma.frames, starter, dma.grid_point, call_index, kernel,
        follow[0] if follow else None,
        (dma.dst.buffer.shape, dma.dst.buffer.data.dtype.str) if follow else None,
        before, np.array(dma.dst.read_base(0)) if follow else None)


def handles_out(state: CallState, buf: Buffer, carried: dict[CellKey, list[CarriedDma]]
                ) -> np.ndarray:
    """The int32 array XLA gets for a semaphore the call returns: a handle per element
    to its value (count, DMAs carried), kept in the session's `carried` dict."""
    handles = np.zeros(buf.shape, np.int32)
    for idx in np.ndindex(*buf.shape):
        dmas = tuple(carried.get(_cell_key((buf, idx)), ()))
        count = int(buf.data[idx])
        if not count and not dmas:
            continue
        handle = next(_handles) % (2**31 - 1) or next(_handles)
        state.carried[_key(handle)] = SemaphoreValue(
            count, dmas, sem_name((buf, idx)), state.call_index, state.kernel,
            buf.device, state.sync.last_signal.get((buf.id, idx), ()),
            state.sync.last_signaller.get((buf.id, idx), ""))
        handles[idx] = handle
    return handles


def never_taken(carried: dict[tuple[object, ...], object]) -> list[SemaphoreValue]:
    """The semaphores some call returned and no later call took (the end of a script)."""
    return [value for key, value in carried.items()
            if key[:1] == ("semaphore",) and len(key) == 2 and isinstance(value, SemaphoreValue)
            and not carried.get(_taken_key(key[1]))]


def drop_taken(carried: dict[tuple[object, ...], object]) -> None:
    """Forget the semaphore values a call took (the call's result is kept): what they
    carried lives on in what that call returned, and a long script would keep every
    copy's data otherwise."""
    taken = [key for key in carried if key[:1] == ("semaphore taken",)]
    for key in taken:
        del carried[key]
        carried.pop(_key(key[1]), None)


def forget(carried: dict[tuple[object, ...], object]) -> None:
    """Drop every semaphore value (the script ended: they have been checked)."""
    for key in [k for k in carried if k[:1] in (("semaphore",), ("semaphore taken",))]:
        del carried[key]
