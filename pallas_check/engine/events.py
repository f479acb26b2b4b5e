"""What the engine tells its listeners: typed events, one `Listener` seam, one finding sink.

The engine simulates; at each moment below it builds an event of plain data (names, index
ranges, source frames, grid points: nothing of its own state) and hands it to the listeners
of the call that take that kind. Checkers (pallas_check/checkers/) are listeners that
`emit` findings into the call's `FindingSink`; the timeline (engine/timeline.py) is a
listener that records. The engine never decides what is a defect, and never prints.

No listener, no call: a listener takes an event kind by overriding its `on_...` method;
`Feeds` keeps, once per call, the tuple of takers of each kind, and the engine builds an
event only where that tuple is not empty (the per-access race feed costs nothing with
races off). Events are NamedTuples: immutable, typed, and cheap to build on a hot path.

A new event kind: a NamedTuple here, an `on_...` method on `Listener`, its name in
`EVENT_KINDS`, and the engine moment that builds it.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Protocol

import numpy as np

from pallas_check.findings import Finding, IndexRange, KernelInfo, SourceFrame

Frames = tuple[SourceFrame, ...]
GridPoint = tuple[int, ...] | None


class FindingSink(Protocol):
    """Where a listener puts what it found: the call's findings (one sink, one method)."""

    def emit(self, finding: Finding) -> None: ...


class FindingList(list[Finding]):
    """A sink that keeps what is emitted, in order (a call that never runs)."""

    def emit(self, finding: Finding) -> None:
        self.append(finding)


class CallFacts(NamedTuple):
    """What a listener may know of the call it listens to, given when it is made."""

    kernel: KernelInfo
    call_index: int
    seed: int | None
    races: bool  # race checking asked for (Config.races)


class Cell(NamedTuple):
    """A semaphore cell: its identity (buffer id, index), its buffer's name, and the
    device it lives on."""

    key: tuple[int, tuple[int, ...]]
    buffer: str
    device: int | None

    @property
    def name(self) -> str:
        """As the kernel has it: `sem[1]` (`sem` for a scalar semaphore); made only when
        asked (a DMA signals and waits on cells the race checker only keys by)."""
        index = self.key[1]
        return self.buffer + ("[" + ", ".join(map(str, index)) + "]" if index else "")


# -- the happens-before feed (races, the timeline) ---------------------------------------
class Access(NamedTuple):
    """An actor read or wrote a box of a buffer (one per box of a reshaped view)."""

    actor: str
    buffer_id: int
    buffer: str
    memory_space: str
    index_range: IndexRange
    is_write: bool
    operation: str
    frames: Frames
    grid_point: GridPoint
    atomic_add: bool = False  # an atomic read-modify-write add (a SparseCore scatter-add)


class ActorsDeclared(NamedTuple):
    """Every root actor of the call (its cores, DMAs carried in), before any acts."""

    actors: frozenset[str]


class KernelEntered(NamedTuple):
    """Each device entered the kernel: its private memory became the kernel's (`writes`),
    then the cores of one device rendezvous (`cores`: actor, device)."""

    writes: tuple[Access, ...]
    cores: tuple[tuple[str, int], ...]


class DmaStarted(NamedTuple):
    """A DMA began: an actor of its own (`actor`), forked by `starter` on `device`/`core`."""

    id: int
    actor: str
    starter: str
    device: int
    core: int
    src: str
    dst: str
    nbytes: int
    frames: Frames
    to_device: int | None
    dst_cell: Cell
    carried: bool  # started by an earlier call: on the timeline only, no fork
    read_done: bool  # (carried) already past its read


class DmaMoved(NamedTuple):
    """A DMA read its source (`landed` False) or wrote its destination (True) — one access
    per box — and signalled `signalled`; having written, it ends."""

    id: int
    actor: str
    landed: bool
    accesses: tuple[Access, ...]
    signalled: Cell | None
    replayed: bool = False  # landed in an earlier call, replayed for races only


class Signalled(NamedTuple):
    actor: str
    device: int
    core: int
    cell: Cell


class Waited(NamedTuple):
    """A wait on `cell` completed (`what`: "DMA wait" or "semaphore wait"); `owed`: the DMAs
    on the cell still not fully waited (the others are accounted for)."""

    actor: str
    device: int
    core: int
    cell: Cell
    what: str
    owed: tuple[int, ...]


class GridStep(NamedTuple):
    actor: str
    device: int
    core: int
    point: tuple[int, ...]


class CoreDone(NamedTuple):
    """A core finished its grid: it accesses nothing more."""

    actor: str
    device: int
    core: int


class CopyStarted(NamedTuple):
    """A BlockSpec pipeline copy began (an actor forked by the core; `track`: its VMEM
    buffer). Transitional: pipeline copies are to report as DMAs."""

    actor: str
    device: int
    core: int
    name: str
    track: str


class CopyMoved(NamedTuple):
    """The copy read (copy-in) or wrote (write-back) its HBM block, and ended."""

    name: str
    access: Access | None  # None: an empty block, or races off


class CopyWaited(NamedTuple):
    actor: str
    name: str


class Found(NamedTuple):
    """A finding was emitted during the run (the timeline marks where)."""

    finding: Finding


# -- what checkers decide ----------------------------------------------------------------
class Where(NamedTuple):
    """Who was running, and where, at the moment of an event."""

    actor: str
    device: int
    core: int
    grid_point: GridPoint
    frames: Frames


class OutOfBounds(NamedTuple):
    """A load, store or DMA slice reaching outside its buffer (`details`: index, dimension
    and size of each index outside)."""

    where: Where
    operation: str
    buffer: str
    memory_space: str
    shape: tuple[int, ...]
    index_range: IndexRange
    outside: tuple[tuple[str, int, int], ...]  # (index, dimension, size) of each


class BlockOutOfBounds(NamedTuple):
    """A BlockSpec index map selecting a block outside its operand's array."""

    where: Where
    operand: str
    described: str  # the block index as the kernel writes it
    block_index: tuple[int, ...]
    index_range: IndexRange
    shape: tuple[int, ...]
    bad_dims: tuple[int, ...]
    is_output: bool


class DeviceOutOfBounds(NamedTuple):
    where: Where
    device: str
    what: str
    mesh: tuple[tuple[str, int], ...]


class CheckFailed(NamedTuple):
    """The kernel's own `pl.debug_check` is false (`message` formatted, `check` as written)."""

    where: Where
    message: str
    check: str


class BlockedWait(NamedTuple):
    actor: str
    what: str
    semaphore: str
    wanted: int
    current: int
    buffer: str  # the semaphore buffer, or the semaphore's name when no cell is known
    index_range: IndexRange | None
    frames: Frames


class Deadlocked(NamedTuple):
    blocked: tuple[BlockedWait, ...]
    grid_point: GridPoint


class SemaphoreLeft(NamedTuple):
    """A semaphore cell with a count at kernel end; `unwaited`: what DMAs never waited on it
    explain of that count."""

    buffer: str
    cell: str
    index: tuple[int, ...]
    device: int | None
    count: int
    unwaited: int
    last_signal: Frames
    last_signaller: str


class CallEnded(NamedTuple):
    """The kernel finished (not deadlocked)."""

    actor: str
    num_devices: int
    semaphores: tuple[SemaphoreLeft, ...]


class DmaNotWaited(NamedTuple):
    id: int
    src: str
    src_range: IndexRange
    dst: str
    dst_range: IndexRange
    dst_space: str
    nbytes: int
    waited_bytes: int
    semaphore: str
    semaphore_count: int
    origin: tuple[int, str] | None  # (call index, kernel name) of a DMA carried in
    actor: str
    grid_point: GridPoint
    frames: Frames


class OutputUnwritten(NamedTuple):
    buffer: str
    unwritten: np.ndarray  # of the output's shape


class UninitRead(NamedTuple):
    """A read of never-written elements (whether they reached an output is decided after
    the call, by the checkers); `note`: why the memory is never written where the engine
    knows more than the buffer's name says (an output block a revisit re-fetched)."""

    buffer: str
    memory_space: str
    index_range: IndexRange
    frames: Frames
    grid_point: GridPoint
    actor: str
    count: int
    note: str = ""


class UnboundedDma(NamedTuple):
    """A DMA the call stopped at: a slice size no part of its ref holds. `reads`: how many
    reads of never-written memory came before it; `ranges`: (source, destination)."""

    id: int
    frames: Frames
    ranges: tuple[IndexRange, IndexRange]
    names: tuple[str, str]
    reads: int
    grid_point: GridPoint
    actor: str


class FillsCompared(NamedTuple):
    """The call re-run with the other fill: every device's outputs (`names` each), both
    runs', what the kernel wrote of each (None: not checked), and the reads of
    never-written memory of the first run."""

    names: tuple[str, ...]
    outputs: tuple[np.ndarray, ...]
    other: tuple[np.ndarray, ...]
    written: tuple[np.ndarray | None, ...]
    reads: tuple[UninitRead, ...]


class DmaAddressCompared(NamedTuple):
    """The re-run with the other fill up to the DMA the call stopped at: `other` its ranges
    there (None: not reached); `reads`: the reads of never-written memory before it."""

    dma: UnboundedDma
    other: tuple[IndexRange, IndexRange] | None
    reads: tuple[UninitRead, ...]


class RevisitLost(NamedTuple):
    """An output block visited again after other blocks loses what an earlier visit did
    (engine/call/revisit.py decides it)."""

    output: str
    block: tuple[int, ...]
    first_point: tuple[int, ...]
    last_point: tuple[int, ...]
    earlier_point: tuple[int, ...]
    inputs: tuple[tuple[str, tuple[int, ...]], ...]
    restored: bool
    by_flow: bool
    elements: int
    index_range: IndexRange
    actor: str
    frames: Frames


class CallSkipped(NamedTuple):
    """Mosaic does not lower the kernel (engine/jaxpr/mosaic_limits.py): never run."""

    message: str
    buffer: str
    memory_space: str
    operation: str
    mosaic: str
    frames: Frames


class KernelPrint(NamedTuple):
    """One line a kernel printed (`pl.debug_print`), with who printed it. The engine only
    collects them, in simulated order; the session writes them after the call."""

    device: int
    core: int
    grid_point: GridPoint
    text: str

    def line(self) -> str:
        """`[dev 1 core 0 (2, 0)] text`: which device, core and grid step printed it (on
        each line of a text of several, e.g. a 2-D array)."""
        where = f"dev {self.device} core {self.core}"
        if self.grid_point:  # (a kernel with no grid has one step: nothing to tell)
            where += f" {tuple(self.grid_point)}"
        return "\n".join(f"[{where}] {part}" for part in self.text.split("\n"))


class Listener:
    """Takes the events it overrides a method for; the others are never called for it."""

    def on_access(self, event: Access) -> None: ...
    def on_actors_declared(self, event: ActorsDeclared) -> None: ...
    def on_kernel_entered(self, event: KernelEntered) -> None: ...
    def on_dma_started(self, event: DmaStarted) -> None: ...
    def on_dma_moved(self, event: DmaMoved) -> None: ...
    def on_signalled(self, event: Signalled) -> None: ...
    def on_waited(self, event: Waited) -> None: ...
    def on_grid_step(self, event: GridStep) -> None: ...
    def on_core_done(self, event: CoreDone) -> None: ...
    def on_copy_started(self, event: CopyStarted) -> None: ...
    def on_copy_moved(self, event: CopyMoved) -> None: ...
    def on_copy_waited(self, event: CopyWaited) -> None: ...
    def on_found(self, event: Found) -> None: ...
    def on_out_of_bounds(self, event: OutOfBounds) -> None: ...
    def on_block_out_of_bounds(self, event: BlockOutOfBounds) -> None: ...
    def on_device_out_of_bounds(self, event: DeviceOutOfBounds) -> None: ...
    def on_check_failed(self, event: CheckFailed) -> None: ...
    def on_deadlocked(self, event: Deadlocked) -> None: ...
    def on_call_ended(self, event: CallEnded) -> None: ...
    def on_dma_not_waited(self, event: DmaNotWaited) -> None: ...
    def on_output_unwritten(self, event: OutputUnwritten) -> None: ...
    def on_fills_compared(self, event: FillsCompared) -> None: ...
    def on_dma_address_compared(self, event: DmaAddressCompared) -> None: ...
    def on_revisit_lost(self, event: RevisitLost) -> None: ...
    def on_call_skipped(self, event: CallSkipped) -> None: ...


EVENT_KINDS: tuple[str, ...] = tuple(name[3:] for name in vars(Listener)
                                     if name.startswith("on_"))
# Each event class -> its kind (from `Listener`'s annotations: one `on_...` per class).
KIND_OF: dict[type, str] = {globals()[getattr(Listener, "on_" + kind).__annotations__["event"]]:
                            kind for kind in EVENT_KINDS}
Event = (Access | ActorsDeclared | KernelEntered | DmaStarted | DmaMoved | Signalled | Waited
         | GridStep | CoreDone | CopyStarted | CopyMoved | CopyWaited | Found | OutOfBounds
         | BlockOutOfBounds | DeviceOutOfBounds | CheckFailed | Deadlocked | CallEnded
         | DmaNotWaited | OutputUnwritten | FillsCompared | DmaAddressCompared | RevisitLost
         | CallSkipped)


@functools.cache
def kinds_taken(listener: type[Listener]) -> tuple[str, ...]:
    """The event kinds a listener class takes: those whose `on_...` method it overrides."""
    return tuple(kind for kind in EVENT_KINDS
                 if getattr(listener, "on_" + kind) is not getattr(Listener, "on_" + kind))


class Feeds:
    """Per event kind, the bound `on_...` methods of the listeners that take it (an
    attribute per kind, e.g. `feeds.access`), computed once per call."""

    def __init__(self, listeners: tuple[Listener, ...]) -> None:
        self.listeners = listeners
        for kind in EVENT_KINDS:
            setattr(self, kind, ())
        for listener in listeners:
            for kind in kinds_taken(type(listener)):
                setattr(self, kind, getattr(self, kind) + (getattr(listener, "on_" + kind),))

    def without(self, kind: str) -> None:
        """Stop feeding `kind` (after the run, findings no longer mark the timeline)."""
        setattr(self, kind, ())


class Checking(Protocol):
    """What a call is checked by: its listeners, made afresh for each simulation."""

    def listeners(self, call: CallFacts, sink: FindingSink) -> tuple[Listener, ...]: ...


_default: Checking | None = None


def set_default_checking(checking: Checking) -> None:
    """What a call is checked by when its caller names nothing (pallas_check.checkers
    registers itself here when imported)."""
    global _default
    _default = checking


def default_checking() -> Checking:
    if _default is None:
        raise RuntimeError("no checkers: import pallas_check.checkers (or pass checkers=)")
    return _default

