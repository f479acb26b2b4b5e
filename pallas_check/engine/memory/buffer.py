"""Simulated TPU memory: buffers with a shadow of written elements, and ref views onto them.

A kernel's refs are `RefView`s: a buffer plus the ref transforms (indexers, bitcasts,
reshapes) applied to it. Every access resolves a view to a `Region` of the buffer
(region.py), which says which elements are touched: for bounds, the written-shadow and the
race detector (checkers/races.py). Buffers here lend their storage when nothing else holds
it (the lending below); how views map elements through transforms is views.py.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import sys
from types import EllipsisType
from typing import TYPE_CHECKING, Sequence, Union

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:  # annotations only: a buffer needs no JAX
    from pallas_check.jaxbridge.types import Transform

# A numpy index of a buffer's elements: basic (ints, slices, Ellipsis) or advanced
# (index arrays, a boolean mask, `np.ix_` meshes).
IndexPart = Union[int, np.integer, slice, EllipsisType, np.ndarray, None]
NumpyIndex = Union[IndexPart, tuple[IndexPart, ...]]
# Where a buffer sits in the kernel (`("hbm", 0)`, `("scratch", 2)`, `("barrier",)`, a
# scoped allocation's site): opaque, hashable parts compared whole.
BufferKey = tuple[object, ...]
# One base dimension of an access (engine/memory/region.py): an int index (the dimension
# is dropped) or a strided range (start, size, stride).
IndexDim = Union[int, tuple[int, int, int]]


_buffer_ids = itertools.count()


class MemorySpace:
    """Names of the memory spaces as shown to users."""

    HBM = "HBM"
    VMEM = "VMEM"
    SMEM = "SMEM"
    SEMAPHORE = "SEMAPHORE"
    VMEM_SHARED = "VMEM_SHARED"


# XLA's CPU client takes an argument's memory as it is only when it is aligned to 64
# bytes; numpy's allocations are aligned to 16, so most copies read out of a buffer were
# copied once more on their way into a compiled segment.
_ALIGN = 64
# Arrays under this many bytes are copied plainly: neither alignment nor a copy saved
# (`Buffer.lend`) pays for its own bookkeeping there.
_SMALL_BYTES = 4096


def aligned_empty(shape: Sequence[int], dtype: npt.DTypeLike) -> np.ndarray:
    """An uninitialized array whose memory starts at a multiple of 64 bytes (a view of the
    uint8 array that owns it)."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + _ALIGN, np.uint8)
    start = -raw.ctypes.data % _ALIGN
    out: np.ndarray = raw[start: start + nbytes].view(dtype).reshape(shape)
    return out


def aligned_copy(values: np.ndarray) -> np.ndarray:
    """A copy of `values` whose memory starts at a multiple of 64 bytes (a small one:
    wherever numpy puts it)."""
    if values.nbytes < _SMALL_BYTES:
        return np.array(values)
    out = aligned_empty(values.shape, values.dtype)
    np.copyto(out, values)
    return out


def fill_value(dtype: npt.DTypeLike, fill: str) -> np.ndarray:
    """The value never-written memory holds under a fill mode ('nan' or 'zero')."""
    dtype = np.dtype(dtype)
    if dtype.fields is not None:  # typed PRNG keys (jaxbridge/keys.py): their words
        return np.frombuffer(bytes([0 if fill == "zero" else 0xFF]) * dtype.itemsize,
                             dtype).reshape(())
    if fill == "zero":
        return np.zeros((), dtype)
    if np.issubdtype(dtype, np.floating) or dtype.kind == "V" or "float" in dtype.name:
        return np.array(np.nan, dtype=dtype)
    if np.issubdtype(dtype, np.integer):
        return np.array(np.iinfo(dtype).max, dtype=dtype)
    if dtype == np.bool_:
        return np.array(True)
    return np.zeros((), dtype)


def all_written(written: bool | np.ndarray) -> bool:
    """Whether a written-shadow (True/False for all, or one bool per element) says every
    element was written."""
    return bool(written.all()) if isinstance(written, np.ndarray) else bool(written)


def _basic(index: NumpyIndex) -> bool:
    """Whether a numpy index is basic (ints, slices, Ellipsis): it selects a view."""
    for i in index if index.__class__ is tuple else (index,):
        kind = i.__class__
        if kind is not int and kind is not slice and i is not Ellipsis and not isinstance(
                i, (int, np.integer)):
            return False
    return True


def _countable(data: np.ndarray) -> bool:
    """Whether every view of `data` holds a reference we can count: `data` owns its
    memory, or is a view of an array that does (an aligned allocation)."""
    base = data.base
    return base is None or (base.__class__ is np.ndarray and base.base is None)


def _holder_counts(buffer: "Buffer") -> tuple[int, int]:
    """References to a buffer's `data` and to the array owning its memory (0 when that is
    `data`): a numpy view references the owner, so a value lent out shows up here."""
    data = buffer.data
    base = data.base
    return sys.getrefcount(data), 0 if base is None else sys.getrefcount(base)


def _held_elsewhere(buffer: "Buffer", alone: dict[bool, tuple[int, int]] | None = None) -> bool:
    """Whether anything but the buffer holds its `data` or a view of that memory."""
    data_refs, base_refs = _holder_counts(buffer)
    data_alone, base_alone = (alone or _ALONE)[buffer.data.base is None]
    return data_refs > data_alone or base_refs > base_alone


class Buffer:
    """One allocation: its values, which elements were ever written, and its user-facing name.

    Memory is proportional to the kernel's data, never more than needed: a buffer made
    from a read-only array (a call's operand) shares it until first written (copy on
    write), and a buffer written everywhere keeps no shadow until something marks part
    of it unwritten again.
    """

    __slots__ = ("id", "name", "space", "data", "_written", "fully_written", "owner", "key",
                 "device", "core", "_unwritten", "_borrowed", "is_output", "_lent",
                 "_lend_ok", "unraced")

    def __init__(
        self,
        name: str,
        space: str,
        data: np.ndarray,
        written: bool | np.ndarray = False,
        owner: str = "",
    ) -> None:
        self.id = next(_buffer_ids)
        self.name = name
        self.space = space
        self.data = data
        self._borrowed = not data.flags.writeable  # an operand's array: copy before writing
        self._lent = False  # a read returned a view of `data`: see `writable`
        self._lend_ok = True  # reads may return views (`lend`)
        self.is_output = False  # a call's output (in HBM, or its block in VMEM)
        # Nothing writes it during the call, so no race can involve it: its accesses
        # build no event for the race checker (engine/call/unraced.py).
        self.unraced = False
        self.owner = owner
        # Where the buffer sits in the kernel (set when registered with a call).
        self.key: BufferKey = ()
        self.device = 0
        self.core: int | None = None
        self._written: np.ndarray | None
        if isinstance(written, np.ndarray):
            self._written = written
            self.recount()
        elif written:
            self._written = None  # all written: no shadow
            self._unwritten = 0
            self.fully_written = True
        else:
            self._written = np.zeros(data.shape, bool)
            self._unwritten = int(self._written.size)
            self.fully_written = self._unwritten == 0

    @classmethod
    def filled(cls, name: str, space: str, shape: Sequence[int], dtype: npt.DTypeLike,
               fill: str, owner: str = "") -> "Buffer":
        data = aligned_empty(tuple(shape), dtype)
        data[...] = fill_value(dtype, fill)
        return cls(name, space, data, written=False, owner=owner)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    @property
    def read_only(self) -> bool:
        """The values are an operand's array never written: a write copies them first, so
        the array itself never changes (a reader may keep it instead of a copy)."""
        return self._borrowed

    @property
    def written(self) -> np.ndarray:
        """The written-shadow, one bool per element (made here if the buffer had none)."""
        if self._written is None:
            self._written = np.ones(self.data.shape, bool)
        return self._written

    @property
    def shadow(self) -> np.ndarray | None:
        """The written-shadow, or None when every element is written."""
        return None if self.fully_written else self._written

    def written_at(self, index: NumpyIndex) -> bool | np.ndarray:
        """The shadow of `index`; just True for a buffer written everywhere."""
        if self._written is None:
            return True
        shadow: np.ndarray = self._written[index]
        return shadow

    def writable(self) -> np.ndarray:
        """The values, to write to: copied first while they are a read-only operand, or
        while a value read from them as a view (`lend`) is still held somewhere."""
        if self._borrowed:
            self.data = aligned_copy(self.data)
            self._borrowed = False
        elif self._lent:
            self._lent = False
            if _countable(self.data) and _held_elsewhere(self):
                self.data = aligned_copy(self.data)  # the views keep the old memory
                self._lend_ok = False
        return self.data

    def lend(self, values: np.ndarray) -> np.ndarray | None:
        """`values` (a view of `data`) as a read's result, without a copy, when that is
        safe and likely to pay: at least half the buffer, contiguous and aligned, its
        holders countable. A write copies the buffer first while such a view lives (copy
        on write), so a value read never changes; after one such copy the buffer's reads
        are copies again (its values outlive its next write: lending only moves the copy,
        and makes it larger). None: make a copy."""
        if not (_LENDING and self._lend_ok) or values.nbytes * 2 < self.data.nbytes \
                or not values.flags.c_contiguous or not _countable(self.data) \
                or values.ctypes.data % _ALIGN:
            return None
        values.flags.writeable = False
        self._lent = True
        return values

    def recount(self) -> None:
        """Recompute `fully_written` from the shadow (after writing `written` directly)."""
        if self._written is None:
            self._unwritten = 0
        else:
            self._unwritten = int(self._written.size - np.count_nonzero(self._written))
        self.fully_written = self._unwritten == 0

    def adopt(self, values: np.ndarray, written: bool | np.ndarray) -> None:
        """Take `values` (of the buffer's shape, which nobody else writes) as the whole
        contents: a read-only array is shared until written (copy on write)."""
        self.data = values
        self._borrowed = not values.flags.writeable
        # Arrays move between buffers (a written-back block comes back as the next one):
        # memory taken over may have been lent out by its former buffer.
        self._lent = True
        if not all_written(written):
            self._written = (written if isinstance(written, np.ndarray)
                             else np.zeros(values.shape, bool))
            self.recount()
        else:
            self._written = None
            self._unwritten = 0
            self.fully_written = True

    def mark_written(self, index: NumpyIndex, value: bool | np.ndarray = True) -> None:
        """Set the shadow of `index` (a basic index: ints, slices, Ellipsis); costs the size
        of the indexed part, not of the buffer (a count of unwritten elements is kept)."""
        if value is True and self.fully_written:
            return  # a scratch buffer once every element was written: nothing changes
        if self._written is None:
            if value.all() if isinstance(value, np.ndarray) else bool(value):
                return  # already written everywhere
            if index is Ellipsis and not isinstance(value, np.ndarray):
                self._written = np.zeros(self.data.shape, bool)
                self.recount()
                return
            self._written = np.ones(self.data.shape, bool)
        if not _basic(index):
            self._written[index] = value  # advanced indexing: recount the whole buffer
            self.recount()
            return
        part = self._written[index]
        if value is True and part.__class__ is np.ndarray:  # a view: count once, not twice
            before = int(np.count_nonzero(part))
            if before != part.size:
                part[...] = True
                self._unwritten -= part.size - before
                self.fully_written = self._unwritten == 0
            return
        before = int(np.count_nonzero(part))
        self._written[index] = value
        after = int(np.count_nonzero(self._written[index]))
        self._unwritten -= after - before
        self.fully_written = self._unwritten == 0

    def mark_flat(self, flat: np.ndarray, value: bool | np.ndarray) -> None:
        """Set the shadow of the elements at flat (C-order) indices `flat` (distinct);
        costs their number, not the buffer's size."""
        if self._written is None:
            if value.all() if isinstance(value, np.ndarray) else bool(value):
                return  # already written everywhere
            self._written = np.ones(self.data.shape, bool)
        elif not self._written.flags.c_contiguous:
            self._written = np.ascontiguousarray(self._written)
        shadow = self._written.reshape(-1)  # a view: the shadow is C-contiguous
        before = int(np.count_nonzero(shadow[flat]))
        shadow[flat] = value
        self._unwritten -= int(np.count_nonzero(shadow[flat])) - before
        self.fully_written = self._unwritten == 0

    def __repr__(self) -> str:
        return f"Buffer({self.name}, {self.space}, {self.data.dtype}{list(self.data.shape)})"


@dataclasses.dataclass(frozen=True)
class RefView:
    """A kernel ref: a buffer seen through a chain of ref transforms."""

    buffer: Buffer
    transforms: tuple[Transform, ...] = ()

    def with_transforms(self, more: Sequence[Transform]) -> "RefView":
        if not more:
            return self
        return RefView(self.buffer, self.transforms + tuple(more))


def _lone_buffer(owning: bool) -> "Buffer":
    """A buffer whose data only it holds (nothing else in this frame or the caller's)."""
    data = np.zeros(1024, np.float32) if owning else aligned_empty((1024,), np.float32)
    return Buffer("calibration", MemorySpace.VMEM, data, True)


def _calibrate_lending() -> tuple[dict[bool, tuple[int, int]], bool]:
    """The holder counts of a buffer nobody else holds, per memory layout (owning its
    memory or not), measured through the code `writable` runs; and whether the check then
    sees a view and a second reference (else lending stays off: a copy is always safe)."""
    alone: dict[bool, tuple[int, int]] = {}
    for owning in (True, False):
        alone[owning] = _holder_counts(_lone_buffer(owning))
    works = True
    for owning in (True, False):
        buffer = _lone_buffer(owning)
        view = buffer.data[4:]
        seen_view = _held_elsewhere(buffer, alone)
        del view
        same = buffer.data
        seen_ref = _held_elsewhere(buffer, alone)
        del same
        works = works and seen_view and seen_ref and not _held_elsewhere(buffer, alone)
    return alone, works


_ALONE, _LENDING = _calibrate_lending()


# -- element-exact views: which buffer elements an access through post transforms touches


# -- transforms after a non-indexing step ---------------------------------------------


def memory_space_name(space: object, default: str = MemorySpace.VMEM) -> str:
    if space is None:
        return default
    name = getattr(space, "name", str(space)).upper()
    if name in ("ANY", "HBM", "GLOBAL"):
        return MemorySpace.HBM
    if name in ("SEMAPHORE", "SEMAPHORE_MEM"):
        return MemorySpace.SEMAPHORE
    if name in ("VMEM", "SMEM", "VMEM_SHARED"):
        return name
    return default
