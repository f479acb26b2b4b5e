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

One registry of event kinds (`CLASS_OF`, `KIND_OF`): the core events below are declared
by `Listener`'s `on_...` methods; any other is declared where the engine builds it. A new
event kind is then one engine module: a NamedTuple there under `@event_kind` (its kind
from its name, `DmaMisaligned` -> `dma_misaligned`), built where `call.feeds.takes(...)`
says a listener wants it, handed over with `CallState.tell(event)`; the listener that
wants it defines `on_dma_misaligned`.
"""

from __future__ import annotations

import functools
import re
from typing import Callable, NamedTuple, Protocol, TypeVar, overload

from pallas_check.engine.verdicts import (  # the events of what checkers decide, re-exported
    Frames as Frames, GridPoint as GridPoint, Where as Where, OutOfBounds as OutOfBounds,
    BlockOutOfBounds as BlockOutOfBounds, DeviceOutOfBounds as DeviceOutOfBounds,
    CheckFailed as CheckFailed, BlockedWait as BlockedWait, AbsentSubcore as AbsentSubcore,
    StalledBarrier as StalledBarrier, Deadlocked as Deadlocked, SemaphoreLeft as SemaphoreLeft,
    CallEnded as CallEnded, DmaNotWaited as DmaNotWaited, OutputUnwritten as OutputUnwritten,
    UninitRead as UninitRead, UnlandedDma as UnlandedDma, UnboundedDma as UnboundedDma,
    FillsCompared as FillsCompared, DmaAddressCompared as DmaAddressCompared,
    RevisitLost as RevisitLost, CallSkipped as CallSkipped)
from pallas_check.findings.finding import Finding, IndexRange, KernelInfo


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


# An `Access` from all ten fields in order, without the NamedTuple's own constructor (a
# Python function taking keywords and defaults): with races on, the engine makes one at
# every load, store and DMA.
make_access: Callable[[tuple[str, int, str, str, IndexRange, bool, str, Frames, GridPoint,
                             bool]], Access] = functools.partial(tuple.__new__, Access)


class ActorsDeclared(NamedTuple):
    """Every root actor of the call (its cores, DMAs carried in), before any acts;
    `tracks`: each core's name on its device (device, core, `core 0` or a SparseCore's
    `sparsecore 1 subcore 7`), its track on the timeline."""

    actors: frozenset[str]
    tracks: tuple[tuple[int, int, str], ...] = ()


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
    on the cell still not fully waited (the others are accounted for); empty where no
    listener of waits reads it (`Listener.takes_owed`: the timeline does)."""

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
    """A BlockSpec pipeline copy began (an actor forked by the core; `operand`, `buffer`:
    the VMEM buffer it fills or drains). A copy is a transfer the DMA mode drives as it
    drives the kernel's DMAs (engine/dma/policy.py), with events of its own: it has no
    semaphore a kernel could name and no DMA number, the core waits for it alone (a join,
    not a semaphore acquire), and the timeline draws it on its VMEM buffer's track."""

    actor: str
    device: int
    core: int
    name: str
    operand: str
    buffer: int


class CopyMoved(NamedTuple):
    """The copy read (copy-in) or wrote (write-back) its HBM block, and ended."""

    name: str
    access: Access | None  # None: an empty block, or races off


class CopyWaited(NamedTuple):
    actor: str
    name: str


# SparseCore: the subcore barrier and parallel_loop iterations, as happens-before edges.
class AtBarrier(NamedTuple):
    """A subcore arrived at its SparseCore's barrier (`passed` False: what it did so far
    is released to that barrier's `generation`), or went through it (True: what every
    subcore of its SparseCore did before arriving happens before what it does next)."""

    actor: str
    device: int
    sparsecore: int
    generation: int
    passed: bool


class ParallelLoop(NamedTuple):
    """A `parallel_loop` began (`began`) or ended in `actor`: what the actor did before
    happens before every iteration, every iteration before what it does after."""

    actor: str
    began: bool


class LoopIteration(NamedTuple):
    """An iteration of `loop`'s innermost parallel_loop began or ended: an actor of its own
    (`actor`), concurrent with the other iterations, in clock entry `slot` (iterations that
    share a slot are ordered: engine/rules/sparsecore.py ITERATION_SLOTS)."""

    loop: str
    actor: str
    slot: str
    began: bool


class Found(NamedTuple):
    """A finding was emitted during the run (the timeline marks where)."""

    finding: Finding


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
    """Takes the events it overrides a method for (or defines `on_<kind>` for, a kind
    registered by an engine module); the others are never called for it."""

    # False: the listener reads accesses (`on_access`, a DMA's or copy's) for races alone,
    # so those of buffers nothing writes during the call, which no race can involve, may
    # be left out (engine/call/unraced.py); it learns how many by `accesses_left_out`.
    needs_unwritten_accesses = True
    # False: a DMA's read that carries no access (left out, as above) and signals no
    # semaphore is nothing to it, so the engine need not make that `DmaMoved` for it.
    takes_empty_dma_reads = True
    # False: it reads no `Waited.owed` (the engine leaves it empty where none does).
    takes_owed = True

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
    def on_subcore_barrier(self, event: AtBarrier) -> None: ...
    def on_parallel_loop(self, event: ParallelLoop) -> None: ...
    def on_loop_iteration(self, event: LoopIteration) -> None: ...
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


Event = (Access | ActorsDeclared | KernelEntered | DmaStarted | DmaMoved | Signalled | Waited
         | GridStep | CoreDone | CopyStarted | CopyMoved | CopyWaited | AtBarrier
         | ParallelLoop | LoopIteration | Found | OutOfBounds | BlockOutOfBounds
         | DeviceOutOfBounds | CheckFailed | Deadlocked | CallEnded
         | DmaNotWaited | OutputUnwritten | FillsCompared | DmaAddressCompared | RevisitLost
         | CallSkipped)  # the core events (those `Listener` declares)

# -- the registry of event kinds ---------------------------------------------------------
# One registry: each kind and its event class, both ways, in registration order (the core
# events of `Listener` first, at the end of this module; then each engine module's, as it
# is imported). Filled only by `event_kind`.
CLASS_OF: dict[str, type] = {}
KIND_OF: dict[type, str] = {}
EVENT_KINDS = CLASS_OF.keys()  # every kind registered so far (a live view)

_EventClass = TypeVar("_EventClass", bound=type)


@overload
def event_kind(cls: _EventClass, /) -> _EventClass: ...
@overload
def event_kind(*, kind: str) -> Callable[[_EventClass], _EventClass]: ...


def event_kind(cls: _EventClass | None = None, /, *,
               kind: str | None = None) -> _EventClass | Callable[[_EventClass], _EventClass]:
    """Registers an event class (a NamedTuple) declared where the engine builds it:
    `@event_kind` (its kind is its name in snake case, `DmaMisaligned` ->
    `dma_misaligned`) or `@event_kind(kind="...")`. A listener takes it by defining
    `on_<kind>`. Refuses, at import, a kind or a class already registered: two events of
    one kind would feed each other's listeners."""
    if cls is None:
        return lambda declared: _register(declared, kind)
    return _register(cls, kind)


def snake_case(name: str) -> str:
    """`DmaMisaligned` -> `dma_misaligned`, `DMAMisaligned` -> `dma_misaligned`."""
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()


def _register(cls: _EventClass, kind: str | None) -> _EventClass:
    kind = kind if kind is not None else snake_case(cls.__name__)
    if not issubclass(cls, tuple):
        raise TypeError(f"event {cls.__qualname__}: events are NamedTuples (plain data)")
    if not kind.isidentifier():
        raise ValueError(f"event {cls.__qualname__}: kind {kind!r} is no identifier")
    if kind in CLASS_OF:
        raise ValueError(f"event {cls.__module__}.{cls.__qualname__}: kind {kind!r} is "
                         f"already {CLASS_OF[kind].__module__}.{CLASS_OF[kind].__qualname__}'s")
    if cls in KIND_OF:
        raise ValueError(f"event {cls.__qualname__}: already registered as {KIND_OF[cls]!r}")
    if kind == "listeners" or hasattr(Feeds, kind):
        raise ValueError(f"event {cls.__qualname__}: kind {kind!r} is a name `Feeds` uses")
    CLASS_OF[kind] = cls
    KIND_OF[cls] = kind
    kinds_taken.cache_clear()  # a listener class seen before may take the new kind
    _feed_plan.cache_clear()
    return cls


def _takes(listener: type[Listener], kind: str) -> bool:
    """Whether a listener class takes `kind`: it overrides `Listener`'s `on_<kind>`, or
    defines one for a kind `Listener` does not declare."""
    method = "on_" + kind
    return getattr(listener, method, None) is not getattr(Listener, method, None)


@functools.cache
def kinds_taken(listener: type[Listener]) -> tuple[str, ...]:
    """The event kinds a listener class takes (registering a kind clears this cache)."""
    return tuple(kind for kind in EVENT_KINDS if _takes(listener, kind))


@functools.cache
def _feed_plan(listeners: tuple[type[Listener], ...]
               ) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """Per kind some of these listener classes take, which of them (by position), in
    order (registering a kind clears this cache)."""
    takers: dict[str, list[int]] = {}
    for i, listener in enumerate(listeners):
        # A class is hashable; mypy reads type[Listener]'s __hash__ as the instances'.
        for kind in kinds_taken(listener):  # type: ignore[arg-type]
            takers.setdefault(kind, []).append(i)
    return tuple((kind, tuple(who)) for kind, who in takers.items())


class Feeds:
    """Per event kind, the bound `on_...` methods of the listeners that take it (an
    attribute per kind, e.g. `feeds.access`), computed once per call."""

    def __init__(self, listeners: tuple[Listener, ...]) -> None:
        # Only the kinds some listener takes are set here (a core kind none takes reads
        # the class's empty tuple): a call makes its feeds once, and small calls are many.
        self.listeners = listeners
        feeds = self.__dict__
        for kind, takers in _feed_plan(tuple(type(listener) for listener in listeners)):
            feeds[kind] = tuple(getattr(listeners[i], "on_" + kind) for i in takers)

    def __getattr__(self, kind: str) -> tuple[Callable[..., None], ...]:
        """A kind registered after these feeds were made (its engine module imported
        during the call): its takers, found once and kept. Python calls this only for an
        attribute not set, so the kinds set above cost nothing more."""
        if kind not in CLASS_OF:
            raise AttributeError(f"{type(self).__name__!r} has no event kind {kind!r}")
        takers = tuple(getattr(listener, "on_" + kind) for listener in self.listeners
                       if _takes(type(listener), kind))
        setattr(self, kind, takers)
        return takers

    def takes(self, event: type) -> bool:
        """Whether some listener takes this event class: an engine moment asks before it
        builds an event (`if call.feeds.takes(DmaMisaligned): call.tell(...)`); a hot
        path reads the kind's tuple, `call.feeds.dma_misaligned`, once."""
        return bool(getattr(self, KIND_OF[event]))

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


# The core events: each `Listener.on_<kind>` names its class (one `on_...` per class).
# Their feeds default to no listener (a kind registered later is found by
# `Feeds.__getattr__`).
for _kind in [name[3:] for name in vars(Listener) if name.startswith("on_")]:
    _register(globals()[getattr(Listener, "on_" + _kind).__annotations__["event"]], _kind)
for _kind in EVENT_KINDS:
    setattr(Feeds, _kind, ())
del _kind
