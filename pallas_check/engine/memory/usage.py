"""Memory a kernel never touches: the elements of its scratch and output blocks that no
read or write of the whole call reached (compute-sanitizer's `--track-unused-memory`).

What counts. The kernel's own VMEM/SMEM allocations: `scratch_shapes` (VMEM, SMEM,
VMEM_SHARED), `pl.run_scoped` allocations, and the VMEM blocks of its outputs. Input
blocks are not covered: the pipeline's copy-in writes all of an input block, so only the
kernel body's reads could tell which part it uses, and recording every read would cost
every access of every call (see "What is not covered" below). One allocation is counted
as the kernel sees it: the block a `pl.Buffered(n)` pipeline holds n of is one buffer
here (the unused part is the same in each), and a scratch every core (and device) holds
a copy of is untouched only where no core of any device touched its copy.

What "touched" means, per element, over the whole call (every grid step, core and
device; with several schedules tried, every schedule of the reporting run): written by
the kernel (a store, a masked store's selected elements, a DMA landing there with
defined data), or read (a load, a DMA reading it). No per-access work is done for this:

- "ever written" is the union of the buffer's written-shadow at each point the engine
  resets it (a `run_scoped` scope ending, an output block starting fresh at a new block,
  a revisit's restore) and at the call's end (`EverWritten`);
- a read of an element never written is a read of uninitialized memory, which the engine
  records anyway (with the bounding box of the elements it read): those boxes count as
  read. Any other read is of an element already written, counted above.

So "untouched" = never in any shadow and in no uninitialized read's box. Exact for a
kernel that never touches undefined memory; otherwise it errs only around undefined data:
a read's bounding box may cover elements it skipped (said used: the note says less, never
wrongly more), and two cases are said untouched although something moved undefined data
there -- a store or DMA that copied never-written data over an element nothing reads
afterwards, and a DMA that copies never-written scratch to anything but an output (the
engine records that read only when it reaches an output). Memory holding nothing defined
either way.

What is not covered: the parts of an input block the body never reads (a block larger
than the kernel uses); HBM (not the kernel's to win back); semaphores.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from pallas_check.engine.memory.buffer import Buffer, BufferKey, MemorySpace
from pallas_check.findings.finding import IndexRange, UnusedMemory

# The registry keys (CallState.register) of the allocations counted, by their first part.
_COUNTED_KINDS = ("scratch", "scoped", "block")
_KERNEL_SPACES = (MemorySpace.VMEM, MemorySpace.SMEM, MemorySpace.VMEM_SHARED)
# Past this many boxes the untouched part is not "simple": only its bytes are said.
_MAX_RANGES = 4

# One allocation's untouched elements: (name, memory space, itemsize, its element count,
# untouched mask or None when every element was touched: no mask is made for those).
Untouched = dict[tuple[BufferKey, str], tuple[str, str, int, int, np.ndarray | None]]


class EverWritten:
    """The union, per buffer, of its written-shadow at each reset: what was written before
    the engine made the memory undefined again. Costs nothing for a buffer written
    everywhere (the common case), one OR of its shadow otherwise -- at a reset, which
    itself writes the whole buffer."""

    def __init__(self) -> None:
        self._union: dict[int, np.ndarray] = {}
        self._whole: set[int] = set()

    def before_reset(self, buf: Buffer) -> None:
        """`buf`'s shadow is about to be cleared: keep what it says was written."""
        if buf.id in self._whole:
            return
        if buf.fully_written:
            self._whole.add(buf.id)
            self._union.pop(buf.id, None)
            return
        shadow = buf.shadow
        if shadow is None or not shadow.any():
            return
        seen = self._union.get(buf.id)
        if seen is None:
            self._union[buf.id] = np.array(shadow, bool)
        else:
            seen |= shadow

    def never_written(self, buf: Buffer) -> np.ndarray | None:
        """The elements of `buf` never written (neither before a reset nor now); None
        when there are none."""
        if buf.id in self._whole or buf.fully_written:
            return None
        free = ~buf.written
        seen = self._union.get(buf.id)
        if seen is not None:
            free &= ~seen
        return free


def untouched(registry: dict[tuple[int, int | None, BufferKey], Buffer], ever: EverWritten,
              reads: Iterable[tuple[str, str, IndexRange]]) -> Untouched:
    """Per counted allocation (its registry key without device and core), the elements no
    core of any device wrote or read. `reads`: (buffer name, memory space, range) of the
    reads of never-written elements."""
    # The boxes read per name, each once, and what they leave unread per shape, made
    # once: every core's copy of a scratch has the same name, and 32 SparseCore subcores
    # reading 16k never-written (L,)-vectors once cleared every box in every copy, half
    # a million boxes (issue 54.7).
    read_boxes: dict[tuple[str, str], set[IndexRange]] = {}
    for name, space, box in reads:
        read_boxes.setdefault((name, space), set()).add(box)
    unread: dict[tuple[str, str, tuple[int, ...]], np.ndarray] = {}
    out: Untouched = {}
    for (_, _, key), buf in registry.items():
        if not key or key[0] not in _COUNTED_KINDS or buf.space not in _KERNEL_SPACES:
            continue
        if key[0] == "block" and not buf.is_output:
            continue  # an input block: not covered (see the module's docstring)
        free = ever.never_written(buf)
        read = read_boxes.get((buf.name, buf.space))
        if free is not None and read:
            mask = unread.get((buf.name, buf.space, free.shape))
            if mask is None:
                mask = np.ones(free.shape, bool)
                for box in read:
                    _clear_box(mask, box)
                unread[(buf.name, buf.space, free.shape)] = mask
            free &= mask
        ident = (key, buf.name)
        if ident in out:
            free = _both(out[ident][4], free)
        out[ident] = (buf.name, buf.space, buf.data.dtype.itemsize, buf.data.size, free)
    return out


def _both(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
    """Untouched in both (None: nothing untouched)."""
    if a is None or b is None or a.shape != b.shape:
        return None
    both: np.ndarray = a & b
    return both


def intersect(a: Untouched, b: Untouched) -> Untouched:
    """Untouched in both runs (two schedules of one call): touched in either is touched."""
    out: Untouched = {}
    for ident, (name, space, itemsize, size, free) in a.items():
        other = b.get(ident)
        out[ident] = (name, space, itemsize, size,
                      free if other is None else _both(free, other[4]))
    return out


def notes(found: Untouched) -> list[UnusedMemory]:
    """The note's entries: each allocation with an untouched part, its bytes and ranges."""
    out = []
    for name, space, itemsize, size, free in found.values():
        if free is None:
            continue
        count = int(np.count_nonzero(free))
        if not count:
            continue
        out.append(UnusedMemory(name, space, count * itemsize, size * itemsize,
                                tuple(boxes(free) or ())))
    return out


def _clear_box(mask: np.ndarray, box: IndexRange) -> None:
    """Mark the elements of `box` (clipped to the mask) as touched."""
    if len(box) != mask.ndim:
        return
    index = tuple(slice(max(lo, 0), max(min(hi, n), 0)) for (lo, hi), n in zip(box, mask.shape))
    mask[index] = False


def boxes(mask: np.ndarray) -> list[IndexRange] | None:
    """The True elements of `mask` as a few boxes (at most `_MAX_RANGES`), or None when they
    are not that simple. A scalar buffer is the empty range."""
    if mask.ndim == 0:
        return [()] if bool(mask) else []
    if not mask.any():
        return []
    hit = [np.nonzero(mask.any(axis=tuple(a for a in range(mask.ndim) if a != d)))[0]
           for d in range(mask.ndim)]
    box = tuple((int(h[0]), int(h[-1]) + 1) for h in hit)
    if mask[tuple(slice(lo, hi) for lo, hi in box)].all():
        return [box]
    # Runs of equal slices along the first axis, each made of boxes of its own.
    out: list[IndexRange] = []
    start = 0
    rows = mask.shape[0]
    while start < rows:
        stop = start + 1
        while stop < rows and np.array_equal(mask[stop], mask[start]):
            stop += 1
        inner = boxes(mask[start]) if mask.ndim > 1 else ([()] if mask[start] else [])
        if inner is None:
            return None
        out.extend(((start, stop),) + tuple(b) for b in inner)
        if len(out) > _MAX_RANGES:
            return None
        start = stop
    return out
