"""What checkers decide: the engine's events that checkers turn into findings (bounds,
assertions, deadlocks, semaphores, never-written memory, revisits, lowering).

Part of the event protocol of engine/events.py (which holds the seam, the happens-before
feed, and takes these into `Listener`): plain typed data, no `Any`, nothing of the
engine's state.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pallas_check.findings.finding import IndexRange, SourceFrame

Frames = tuple[SourceFrame, ...]
GridPoint = tuple[int, ...] | None


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
    """A BlockSpec index map selecting a block outside its operand's array: `where` is
    the grid point whose index map chose it (and its index map's line); `prefetched_at`
    the grid point during which the pipeline fetched it ahead (None: fetched at its own
    step), which is when the copy reads outside the array on a TPU."""

    where: Where
    operand: str
    described: str  # the block index as the kernel writes it
    block_index: tuple[int, ...]
    index_range: IndexRange
    shape: tuple[int, ...]
    bad_dims: tuple[int, ...]
    is_output: bool
    prefetched_at: GridPoint = None


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
    barrier: str = ""  # a SparseCore's subcore barrier it waits at (`StalledBarrier.where`)


class AbsentSubcore(NamedTuple):
    """A subcore its SparseCore's barrier waits for: `finished` its kernel, or waits in
    `waits_in` (`what (semaphore)`), or neither (it never reached the barrier)."""

    subcore: int
    actor: str
    finished: bool
    waits_in: str


class StalledBarrier(NamedTuple):
    """A SparseCore's subcore barrier some subcores wait at, and those that never arrive."""

    where: str  # `device 0 sparsecore 1`
    members: int
    waiting: tuple[str, ...]
    line: int | None  # of the barrier the first to arrive reached
    absent: tuple[AbsentSubcore, ...]


class LostTransfer(NamedTuple):
    """A signal or DMA (`what`) that `actor` addressed to core `core` of its TensorCore
    mesh, on a chip that has no such core (engine/call/serial.py): it never arrived."""

    what: str
    actor: str
    core: int
    frames: Frames


class SerialCores(NamedTuple):
    """A call whose TensorCore mesh of `cores` cores ran them one after another on the one
    TensorCore of a `tpu` chip (engine/call/serial.py): the cores that never started (each
    waits for the core before it to end) and what was addressed to a core the chip does
    not have."""

    tpu: str
    cores: int
    not_started: tuple[str, ...]
    lost: tuple[LostTransfer, ...]


class Deadlocked(NamedTuple):
    blocked: tuple[BlockedWait, ...]
    grid_point: GridPoint
    barriers: tuple[StalledBarrier, ...] = ()
    serial: SerialCores | None = None  # the call's mesh ran its cores one after another


class SemaphoreLeft(NamedTuple):
    """A semaphore cell with a count at kernel end; `unwaited`: what DMAs never waited on it
    explain of that count."""

    buffer: str
    cell: str
    index: tuple[int, ...]  # type: ignore[assignment]  # shadows tuple.index: reports' name
    device: int | None
    count: int  # type: ignore[assignment]  # shadows tuple.count: reports' name
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
    waited_bytes: int  # in `signal`'s units
    semaphore: str
    semaphore_count: int
    origin: tuple[int, str] | None  # (call index, kernel name) of a DMA carried in
    actor: str
    grid_point: GridPoint
    frames: Frames
    signal: int = -1  # what it added to its semaphore: its bytes, or a regular one's count


class OutputUnwritten(NamedTuple):
    """Output elements never written. For a blocked output, `block_shape` and the blocks
    no grid point's index map selects (`unvisited`: the first few, `unvisited_count`: how
    many); `block_shape` None: not a blocked output (or blocks not counted)."""

    buffer: str
    unwritten: np.ndarray  # of the output's shape
    block_shape: tuple[int, ...] | None = None
    unvisited: tuple[tuple[int, ...], ...] = ()
    unvisited_count: int = 0
    # An output aliased to an input: the elements whose input values were overwritten
    # with memory the kernel never wrote (a visited block written back whole).
    clobbered: bool = False


class UnlandedDma(NamedTuple):
    """The DMA filling the memory a read of never-written elements touched, started but
    not landed when the read came (read before its wait): `frames` where it was started,
    `wait` where the wait that took its bytes is (empty: never waited)."""

    id: int
    frames: Frames
    wait: Frames = ()


class UninitRead(NamedTuple):
    """A read of never-written elements (whether they reached an output is decided after
    the call, by the checkers); `note`: why the memory is never written where the engine
    knows more than the buffer's name says (an output block a revisit re-fetched)."""

    buffer: str
    memory_space: str
    index_range: IndexRange | None  # None: lanes no memory holds (`undefined_lanes`)
    frames: Frames
    grid_point: GridPoint
    actor: str
    count: int  # type: ignore[assignment]  # shadows tuple.count: reports' name
    note: str = ""
    dma: UnlandedDma | None = None  # a DMA into that memory, started and not yet landed


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
