"""DMAs and semaphores as small state machines: a `Dma` in flight, the call's `SyncState`
(DMAs in flight per semaphore, who signalled last), semaphore cells and their counts, and a
DMA's two events. DMA semaphores count bytes, as on a TPU, and a DMA is two events: it
reads its source, which signals the send semaphore (`wait_send`: the source may be reused),
then it writes its destination, which signals the receive semaphore (`wait_recv`: the data
has landed). When each event happens is the DMA mode's (engine/dma/policy.py: `eager`,
`on_wait`, `random`, where `dma_actor` runs them where the scheduler puts them), which
drives a `Dma` and a BlockSpec pipeline's block copy alike (both are `Transfer`s); the
rules that start and wait DMAs are engine/rules/dma.py's and engine/rules/semaphore.py's.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from typing import TYPE_CHECKING, Generator, Protocol

import numpy as np

from pallas_check.jaxbridge.types import SelectTransform, TransformedRef
from pallas_check.engine.jaxpr.halts import KernelError
from pallas_check.engine.jaxpr.evaluating import Evaluating
from pallas_check.engine.jaxpr.program import current_frames
from pallas_check.engine.memory.buffer import Buffer, RefView, all_written
from pallas_check.engine.memory.region import Region, resolve
from pallas_check.engine.memory.views import same_bits
from pallas_check.engine.runtime.scheduler import Scheduler
from pallas_check.findings.finding import IndexRange, KernelInfo, SourceFrame, format_range
from pallas_check.engine.verdicts import LostTransfer

# A semaphore cell: its buffer and the index of the one semaphore in it; and its key, by
# the buffer's id.
SemCell = tuple[Buffer, tuple[int, ...]]
CellKey = tuple[int, tuple[int, ...]]


class DeviceMesh(Protocol):
    """The named device axes a call runs over (engine/call/describe.py's MeshInfo)."""

    @property
    def axes(self) -> tuple[tuple[str, int], ...]: ...

    @property
    def num_devices(self) -> int: ...

    def coords(self, device: int) -> dict[str, int]: ...

    def logical(self, coords: dict[str, int]) -> int: ...


class DmaCall(Protocol):
    """What a DMA, a semaphore and a device id see of the running call (the DMA wing's
    part of the seam; engine/seam.py's `RunningCall` is the rules' whole of it)."""

    @property
    def sync(self) -> SyncState: ...

    @property
    def mesh(self) -> DeviceMesh: ...

    @property
    def cores_per_device(self) -> int: ...

    @property
    def serial_cores(self) -> bool:
        """Whether the cores of the call's TensorCore mesh run one after another on a chip
        with one TensorCore (engine/call/serial.py)."""

    @property
    def scheduler(self) -> Scheduler: ...

    def remote(self, buf: Buffer, device: int, frames: tuple[SourceFrame, ...] = (),
               core: int | None = None) -> Buffer: ...

    def device_out_of_bounds(self, ctx: DmaCore, device: str, what: str,
                             frames: tuple[SourceFrame, ...]) -> None: ...

    def on_dma_read(self, ctx: DmaCore, dma: Dma) -> None: ...

    def on_dma_write(self, ctx: DmaCore, dma: Dma) -> None: ...

    def dma_copied_unwritten(self, dma: Dma, unwritten: np.ndarray) -> None: ...


class Runner(Protocol):
    """Who runs: the actor, its device and core, the grid point (state.py's CoreContext;
    events name it, engine/call/event_data.py)."""

    @property
    def actor(self) -> str: ...

    @property
    def device_id(self) -> int: ...

    @property
    def core_id(self) -> int: ...

    @property
    def grid_point(self) -> tuple[int, ...] | None: ...


class DmaCore(Evaluating, Runner, Protocol):
    """What a DMA and a device id see of the core running kernel code (or that a DMA
    actor runs for)."""

    @property
    def call(self) -> DmaCall: ...

    @property
    def core_coords(self) -> dict[str, int]: ...

    def core_mesh_sizes(self) -> dict[str, int]: ...

    def fill(self, dtype: np.dtype) -> np.ndarray: ...


class Transfer:
    """A copy in flight that a DMA mode drives (engine/dma/policy.py): a kernel's `Dma`
    or a BlockSpec pipeline's block copy (engine/call/pipeline.py). It has an
    `actor_name` (how races, the timeline and the scheduler name it), `copied` (it has
    landed), and its events, all at once (`complete`) or as a scheduler actor (`events`)."""

    __slots__ = ()
    copied: bool
    if TYPE_CHECKING:  # read-only to its users: a Dma's is a property, a BlockCopy's a field
        # (only declared: a real property here would become a dataclass subclass's default)
        @property
        def actor_name(self) -> str: ...

    def complete(self, ctx: DmaCore) -> None:
        raise NotImplementedError

    def events(self, ctx: DmaCore) -> Generator[None, None, None]:
        raise NotImplementedError


@dataclasses.dataclass(slots=True, eq=False)  # (identity: see SyncState.settled)
class Dma(Transfer):
    """One DMA from start to wait."""

    id: int
    src: Region
    dst: Region
    dst_sem: SemCell
    src_sem: SemCell | None
    nbytes: int
    actor: str
    frames: tuple[SourceFrame, ...]
    grid_point: tuple[int, ...] | None
    # What its read adds to the send semaphore and its landing to the receive semaphore,
    # and what waits must take off again: its bytes on DMA semaphores, 1 on regular ones
    # (`signal_count`).
    signal: int
    read_done: bool = False  # the source was read (the send semaphore signalled)
    copied: bool = False  # the destination was written (the receive semaphore signalled)
    waited_bytes: int = 0  # taken off by waits so far, in `signal`'s units
    # (values, written-shadow) read from the source, not yet written
    staged: tuple[np.ndarray, bool | np.ndarray] | None = None
    # A DMA started by an earlier pallas_call and carried in by a semaphore it signals
    # (engine/call/carried.py): (that call's index, its KernelInfo, the actor that started it).
    origin: tuple[int, KernelInfo, str] | None = None
    # Its write adds to the destination atomically (a SparseCore scatter-add or gather-add,
    # engine/dma/indirect.py): two such writes never race with each other.
    atomic_add: bool = False
    # Where the wait that took its last bytes is (empty until then): a read of its
    # destination before it landed names it (the help of an uninitialized finding).
    waited_at: tuple[SourceFrame, ...] = ()
    # `actor_name`, once made (every event of the DMA a race checker takes names it).
    _name: str = dataclasses.field(default="", repr=False)

    @property
    def actor_name(self) -> str:
        """The DMA as an actor, as race reports name it."""
        name = self._name
        if not name:
            where = f" at {self.frames[0].file}:{self.frames[0].line}" if self.frames else ""
            name = self._name = f"DMA #{self.id} started by {self.actor}{where}"
        return name

    def complete(self, ctx: DmaCore) -> None:
        complete(ctx, self)

    def events(self, ctx: DmaCore) -> Generator[None, None, None]:
        return dma_actor(ctx, self)


class SyncState:
    """Semaphore counts live in their buffers; this tracks DMAs and who signalled what."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        # The DMAs the call is not done with, by id in start order: in flight, or landed
        # and not yet fully waited. One that has landed and been waited in full is let go
        # (`settled`): what the call's end asks of DMAs (drain, leaks, the DMAs not
        # waited, those carried into the next call) is never about it, and a long grid's
        # DMAs cost no memory once done.
        self._live: dict[int, Dma] = {}
        self.last_signal: dict[CellKey, tuple[SourceFrame, ...]] = {}
        self.last_signaller: dict[CellKey, str] = {}  # the actor, for leak reports
        # Signals and DMAs addressed to a core the chip does not have (devices.py
        # `on_serial_chip`): they never arrived, which a deadlock's help says.
        self.lost: list[LostTransfer] = []
        # Per semaphore cell (buffer id, index), in start order: the DMAs that may still
        # signal it (as receive or send semaphore), and those not yet fully waited on it
        # (so that a wait does not rescan every DMA of the call).
        self._receiving: dict[CellKey, list[Dma]] = {}
        self._sending: dict[CellKey, list[Dma]] = {}
        self._unwaited: dict[CellKey, collections.deque[Dma]] = {}
        # Per destination buffer id: the DMAs into it that may not have landed yet, for a
        # read of never-written memory to name the DMA it came before (`landing_into`).
        self._landing: dict[int, list[Dma]] = {}

    @property
    def dmas(self) -> list[Dma]:
        """The DMAs not done with (see `_live`), in start order: a copy, which a caller
        may walk while DMAs complete and settle."""
        return list(self._live.values())

    def keep_only(self, dmas: list[Dma]) -> None:
        """The call's end handed the others on (engine/call/carried.py)."""
        self._live = {dma.id: dma for dma in dmas}

    def start(self, dma: Dma) -> None:
        self._live[dma.id] = dma
        if dma.dst is not None:  # (a contract test's DMA may have no destination)
            landing = self._landing.setdefault(dma.dst.buffer.id, [])
            landing.append(dma)
            n = len(landing)
            if n >= 8 and not n & (n - 1):  # at 8, 16, 32, ...: linear in all, not per start
                landing[:] = [d for d in landing if not d.copied]
        dst = (dma.dst_sem[0].id, dma.dst_sem[1])
        self._receiving.setdefault(dst, []).append(dma)
        if dma.src_sem is not None:
            self._sending.setdefault((dma.src_sem[0].id, dma.src_sem[1]), []).append(dma)
        self._unwaited.setdefault(dst, collections.deque()).append(dma)
        if dma.copied:  # (carried in landed and waited: nothing left to do)
            self.settled(dma)

    def settled(self, dma: Dma) -> None:
        """Let `dma` go if it has landed and been waited in full (its landing and the
        wait that accounts for it come in either order): out of the call's DMAs and out
        of each list that may still hold it (a wait in on_wait mode popped it from its
        semaphore's already). `in` and `remove` compare by identity (`Dma` has no
        field equality), in C: the lists hold what is in flight, a few entries."""
        if not (dma.copied and dma.waited_bytes >= dma.signal):
            return
        if self._live.pop(dma.id, None) is None:
            return
        lists = [self._receiving.get((dma.dst_sem[0].id, dma.dst_sem[1]))]
        if dma.src_sem is not None:
            lists.append(self._sending.get((dma.src_sem[0].id, dma.src_sem[1])))
        if dma.dst is not None:  # (landed: no read can come before it any more)
            lists.append(self._landing.get(dma.dst.buffer.id))
        for dmas in lists:
            if dmas and dma in dmas:
                dmas.remove(dma)

    def next_id(self) -> int:
        return next(self._ids)

    def landing_into(self, buffer_id: int, index_range: IndexRange) -> Dma | None:
        """The newest DMA started into buffer `buffer_id` over elements of `index_range`
        that has not landed yet (a read there came before its wait), or None."""
        for dma in reversed(self._landing.get(buffer_id, ())):
            if not dma.copied and _overlap(dma.dst.index_range(), index_range):
                return dma
        return None

    def landing_only(self, sem: SemCell) -> list[Dma] | None:
        """The DMAs that may still land on `sem`, in start order (the list itself: a
        landed one may be removed), when no DMA signals it as its send semaphore; else
        None (`pending_on` then orders both kinds)."""
        key = (sem[0].id, sem[1])
        if self._sending.get(key):
            return None
        return self._receiving.get(key, [])

    def pending_on(self, sem: SemCell) -> list[tuple[Dma, bool]]:
        """The events still to come that signal `sem`, newest DMA first: (dma, True) for a
        DMA that has yet to land there (receive semaphore), (dma, False) for one that has
        yet to read its source (send semaphore)."""
        key = (sem[0].id, sem[1])
        pending: list[tuple[Dma, bool]] = []
        receiving = self._receiving.get(key)
        if receiving:
            receiving[:] = [d for d in receiving if not d.copied]
            pending.extend((d, True) for d in receiving)
        sending = self._sending.get(key)
        if sending:
            sending[:] = [d for d in sending if not d.read_done]
            pending.extend((d, False) for d in sending)
        if receiving and sending:
            pending.sort(key=lambda item: -item[0].id)
        else:
            pending.reverse()  # each list is in start order
        return pending


def _overlap(a: IndexRange, b: IndexRange) -> bool:
    """Whether two index ranges of one buffer share an element (by their bounding boxes)."""
    return len(a) == len(b) and all(lo < hi2 and lo2 < hi for (lo, hi), (lo2, hi2) in zip(a, b))


def as_view(x: object) -> RefView:
    """A ref argument of a DMA or semaphore primitive, with its transforms applied."""
    if isinstance(x, TransformedRef):
        if isinstance(x.ref, (tuple, list)):
            return as_view(selected_ref(x))
        base = as_view(x.ref)
        return base.with_transforms(tuple(x.transforms))
    if isinstance(x, RefView):
        return x
    raise KernelError(f"expected a ref, got {type(x).__name__}")


def selected_ref(x: TransformedRef) -> object:
    """The ref `pl.select_ref(idx, *refs)` picks (a ref of several, by a traced index),
    as Mosaic lowers it: a chain of `idx == 0` tests, so refs[idx] for 0 <= idx < n - 1
    and the last ref for any other value (no check, no trap)."""
    (transform,) = x.transforms
    if not isinstance(transform, SelectTransform):
        raise KernelError(f"a transform of several refs that is not pl.select_ref:"
                          f" {type(transform).__name__}")
    refs = x.ref
    idx = int(np.asarray(transform.idx))
    return refs[idx] if 0 <= idx < len(refs) - 1 else refs[-1]


def semaphore_cell(ctx: DmaCore, view: RefView) -> SemCell:
    return cell_of(ctx, resolve(view))


def cell_of(ctx: DmaCore, region: Region) -> SemCell:
    """The one semaphore a region picks (a region of several is the kernel's error)."""
    if region.oob or region.post or region.out_shape:
        raise KernelError(
            f"semaphore access {region.buffer.name}{_describe(region)} must pick one"
            " semaphore", current_frames(ctx),
        )
    # In bounds, no stride 0 (that has a shape), never tile padding (DMA data only): plain
    assert region.index is not None
    return region.buffer, region.index  # type: ignore[return-value]  # all ints: one cell


def _describe(region: Region) -> str:
    return format_range(region.index_range())


def sem_value(cell: SemCell) -> int:
    buf, idx = cell
    return int(buf.data[idx])


def sem_add(cell: SemCell, amount: int) -> None:
    buf, idx = cell
    buf.writable()[idx] = buf.data[idx] + amount


def sem_name(cell: SemCell) -> str:
    buf, idx = cell
    if buf.data.ndim == 0:
        return buf.name
    return buf.name + "[" + ", ".join(str(int(i)) for i in idx) + "]"


def dma_read(ctx: DmaCore, dma: Dma) -> None:
    """The DMA reads its source now (values and written-shadow are staged) and signals
    its send semaphore: the source may be reused from here on."""
    if dma.read_done:
        return
    dma.read_done = True
    value = dma.src.read(ctx.fill(dma.src.buffer.data.dtype))
    # Bytes, never a conversion: the source's elements seen as the destination view's
    # (Mosaic's verifier has made sure they are one element type: int32 and uint32 both
    # i32), so a uint32 DMA into a bitcast view of an f32 buffer lands bit for bit.
    dst = dma.dst
    dtype = dst.view_dtype() if dst.post else dst.buffer.data.dtype
    if value.dtype != dtype:
        value = same_bits(value, dtype)
    # A source written everywhere (an input, say) needs no per-element shadow copied along
    # (unless it reaches into tile padding, which is never written).
    written = (True if dma.src.buffer.fully_written and not dma.src.padded
               else dma.src.read_written())
    dma.staged = (value, written)
    if dma.src_sem is not None:
        sem_add(dma.src_sem, dma.signal)
    ctx.call.on_dma_read(ctx, dma)


def dma_write(ctx: DmaCore, dma: Dma) -> None:
    """The DMA writes its destination (reading its source first if it has not yet) and
    signals its receive semaphore: the data has landed."""
    if dma.copied:
        return
    dma_read(ctx, dma)
    assert dma.staged is not None
    value, written = dma.staged
    dma.staged = None
    dma.copied = True
    if dma.dst.padded and not all_written(written):  # what lands in tile padding is dropped
        written = np.asarray(written, bool) | ~dma.dst.inside()
    if dma.dst.buffer.is_output and not all_written(written):
        # Never-written elements copied into an output: the DMA is where they come from,
        # so its read is the uninitialized read that reaches the output (not "elements
        # never written": the DMA wrote them).
        ctx.call.dma_copied_unwritten(dma, ~np.asarray(written, bool))
        written = True
    if dma.dst.post:
        dma.dst.write(value, ctx.fill(value.dtype), written)
    else:
        dma.dst.write_base(value, written)
    ctx.call.on_dma_write(ctx, dma)
    sem_add(dma.dst_sem, dma.signal)
    if dma.waited_bytes >= dma.signal:  # (in on_wait mode the wait accounts after this)
        ctx.call.sync.settled(dma)


def complete(ctx: DmaCore, dma: Dma) -> None:
    """Read and write at once (eager mode, a wait in on_wait mode, kernel end)."""
    dma_read(ctx, dma)
    dma_write(ctx, dma)


def dma_actor(ctx: DmaCore, dma: Dma) -> Generator[None, None, None]:
    """In `random` mode a DMA is an actor: its read and its write each happen at a point
    the scheduler picks, after its start and before what waits for it."""
    yield None
    dma_read(ctx, dma)
    yield None
    dma_write(ctx, dma)
