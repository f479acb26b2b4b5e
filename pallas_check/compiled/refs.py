"""What the compiled tier's tracing hands around: refs into the machine's buffers and
semaphores, what it knows of each buffer, and the exception that sends a call to the engine.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from pallas_check.compiled.boxes import Index, plus

# The machine's state as a pytree (`State.carry`): buffers, shadows, counts, table, verdict.
Carry = tuple[Any, ...]


class Unsupported(Exception):
    """The call needs the engine; the message is the reason, a short phrase."""


@dataclasses.dataclass(frozen=True)
class BufferInfo:
    """One buffer of the call: the kernel's view of an operand, a block, scratch."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    tracked: bool  # has a written-shadow (else every element counts as written)
    scratch: bool  # the kernel's own allocation: left partly untouched is UNTOUCHED
    serial: int = -1  # the allocation's number in the trace (a freed id is used again)


@dataclasses.dataclass(frozen=True)
class SemInfo:
    """A semaphore array: its cells are `base` onward in the machine's count vector."""

    name: str
    base: int
    shape: tuple[int, ...]
    counts_bytes: bool  # a DMA semaphore (a regular one counts signals)


class Ref:
    """A kernel ref while tracing: a buffer (or semaphore array) and the box of it the
    ref's indexing selects: per buffer dimension a start, a static size, and whether the
    dimension is still a dimension of the view (an integer index drops it)."""

    __slots__ = ("buffer", "sem", "starts", "sizes", "kept")

    def __init__(self, buffer: int, sem: bool, starts: tuple[Index, ...],
                 sizes: tuple[int, ...], kept: tuple[bool, ...]) -> None:
        self.buffer, self.sem = buffer, sem
        self.starts, self.sizes, self.kept = starts, sizes, kept

    @classmethod
    def whole(cls, buffer: int, shape: tuple[int, ...], sem: bool = False) -> Ref:
        return cls(buffer, sem, (0,) * len(shape), tuple(shape), (True,) * len(shape))

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(s for s, k in zip(self.sizes, self.kept) if k)

    def indexed(self, indexer: Any) -> Ref:
        """The ref after one NDIndexer: a `pl.ds` of static size and stride 1, or an
        integer, per dimension of the view (anything else needs the engine)."""
        if tuple(getattr(indexer, "int_indexer_shape", ()) or ()):
            raise Unsupported("an index array")
        starts, sizes, kept = list(self.starts), list(self.sizes), list(self.kept)
        dims = [d for d, k in enumerate(self.kept) if k]
        if len(indexer.indices) != len(dims):
            raise Unsupported("an indexer of another rank")
        for d, index in zip(dims, indexer.indices):
            if hasattr(index, "size") and hasattr(index, "stride"):  # a Slice
                if not isinstance(index.size, (int, np.integer)) or index.stride != 1:
                    raise Unsupported("a slice of traced size or with a stride")
                starts[d] = plus(starts[d], index.start)
                sizes[d] = int(index.size)
            else:
                if np.ndim(index) != 0:
                    raise Unsupported("an index array")
                starts[d] = plus(starts[d], index)
                sizes[d], kept[d] = 1, False
        return Ref(self.buffer, self.sem, tuple(starts), tuple(sizes), tuple(kept))
