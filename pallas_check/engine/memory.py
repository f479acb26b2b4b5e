"""Simulated TPU memory: buffers with a shadow of written elements, and ref views onto them.

A kernel's refs are `RefView`s: a buffer plus the ref transforms (indexers, bitcasts,
reshapes) applied to it. Every access resolves a view to a `Region` of the buffer, which
says which elements are touched (for bounds, the written-shadow and, later, races) and
gives a fast numpy path for the common in-bounds, plain-indexing case.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
import sys
import threading
from typing import Any, Sequence

import numpy as np
from pallas_check.jaxbridge import TypedInt, state_indexing
from pallas_check.jaxbridge import state_types

from pallas_check.findings import IndexRange

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


def aligned_empty(shape: Sequence[int], dtype: Any) -> np.ndarray:
    """An uninitialized array whose memory starts at a multiple of 64 bytes (a view of the
    uint8 array that owns it)."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + _ALIGN, np.uint8)
    start = -raw.ctypes.data % _ALIGN
    return raw[start: start + nbytes].view(dtype).reshape(shape)


def aligned_copy(values: np.ndarray) -> np.ndarray:
    """A copy of `values` whose memory starts at a multiple of 64 bytes (a small one:
    wherever numpy puts it)."""
    if values.nbytes < _SMALL_BYTES:
        return np.array(values)
    out = aligned_empty(values.shape, values.dtype)
    np.copyto(out, values)
    return out


def fill_value(dtype: np.dtype, fill: str) -> Any:
    """The value never-written memory holds under a fill mode ('nan' or 'zero')."""
    dtype = np.dtype(dtype)
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


def _basic(index: Any) -> bool:
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
                 "_lend_ok")

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
        self.owner = owner
        # Where the buffer sits in the kernel (set when registered with a call).
        self.key: tuple = ()
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
    def filled(cls, name: str, space: str, shape: Sequence[int], dtype: Any, fill: str,
               owner: str = "") -> "Buffer":
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

    def written_at(self, index: Any) -> bool | np.ndarray:
        """The shadow of `index`; just True for a buffer written everywhere."""
        if self._written is None:
            return True
        return self._written[index]

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

    def mark_written(self, index: Any, value: bool | np.ndarray = True) -> None:
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
    transforms: tuple[Any, ...] = ()

    def with_transforms(self, more: Sequence[Any]) -> "RefView":
        if not more:
            return self
        return RefView(self.buffer, self.transforms + tuple(more))


_NUMPY_INTS = frozenset({np.int32, np.int64, np.uint32, np.int16, np.int8, np.uint8,
                         np.uint16, np.uint64, np.bool_})


def scalar_index(x: Any) -> int | None:
    """A scalar integer index as a Python int; None for anything else (an array of
    indices: a gather). On every access: the common kinds first, by exact class."""
    kind = x.__class__
    if kind is int:
        return x
    if kind in _NUMPY_INTS or isinstance(x, (int, np.integer)):  # JAX's typed literals too
        return int(x)
    if getattr(x, "ndim", None) == 0 and np.dtype(x.dtype).kind in "biu":
        return int(np.asarray(x))
    return None


class _Unhashable:
    __hash__ = None  # type: ignore[assignment]


_CONVERT = _Unhashable()  # in a key: a leaf that needs `scalar_index` first
# Hashed and compared as the ints they hold: a jaxpr's integer literals (an index written
# as a constant in the kernel) among them.
_PLAIN_LEAVES = _NUMPY_INTS | {int, bool, type(None), TypedInt}


class AccessCache:
    """Per call: the region a `ref[indices]` equation touches, by the equation, the refs
    and the scalar index values. A BlockSpec grid or a loop runs the same equation on the
    same refs with the same indices at step after step, and resolving (indexer pytrees,
    bounds, numpy indices) cost more than the access. A region depends only on the view
    and the buffer's shape. A DMA wait's size and semaphore, and a DMA start's local ref
    arguments, are cached the same way (sync.py; a paged kernel's source pages miss every
    time, and a miss costs only its key)."""

    def __init__(self, limit: int = 4096) -> None:
        self._entries: dict[tuple, tuple] = {}
        self._limit = limit

    def get_or_make(self, eqn: Any, leaves: Sequence[Any], make: Any) -> Any:
        # Refs by identity; ints as they are (a numpy int or a jaxpr's typed literal
        # hashes and compares as the int it holds). Any other leaf (a jax scalar, an array
        # of indices) makes the key unhashable: the slower spelling then converts each index.
        key = (id(eqn), *[id(x) if x.__class__ is RefView
                          else x if x.__class__ in _PLAIN_LEAVES else _CONVERT
                          for x in leaves])
        try:
            hit = self._entries.get(key)
        except TypeError:
            return self._get_or_make_converted(eqn, leaves, make)
        if hit is not None:  # the entry keeps its equation and refs alive: same ids, same objects
            return hit[2]
        return self._store(key, eqn, leaves, make())

    def _get_or_make_converted(self, eqn: Any, leaves: Sequence[Any], make: Any) -> Any:
        parts: list = [id(eqn)]
        for x in leaves:
            if x.__class__ is RefView:
                parts.append(id(x))
            elif x is None:
                parts.append(None)
            else:
                value = scalar_index(x)
                if value is None:
                    return make()  # an array of indices (a gather), or not a ref: every time
                parts.append(value)
        key = tuple(parts)
        hit = self._entries.get(key)
        if hit is not None:
            return hit[2]
        return self._store(key, eqn, leaves, make())

    def _store(self, key: tuple, eqn: Any, leaves: Sequence[Any], value: Any) -> Any:
        if len(self._entries) >= self._limit:
            self._entries.clear()
        self._entries[key] = (eqn, [x for x in leaves if x.__class__ is RefView], value)
        return value


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


@dataclasses.dataclass
class OutOfBounds:
    """An index outside a ref's dimension, found while resolving an access."""

    dim: int
    index: str
    size: int


class Region:
    """The elements of a buffer that one access touches.

    `index` is a numpy index (slices and ints) into the buffer for the plain case; `post`
    holds transforms (bitcast, reshape, gathers) that have to be applied after it; an
    access with some sees its buffer through an `ElementMap` (which elements, exactly).
    When some index is out of bounds, `oob` lists where and `masked` holds per-dimension
    index arrays with validity masks, so reads give the fill value there and writes drop.
    """

    __slots__ = ("buffer", "index", "post", "oob", "dims", "out_shape", "zero_stride", "_map")

    def __init__(self, buffer: Buffer, dims: list, post: list, oob: list[OutOfBounds]):
        self.buffer = buffer
        self.dims = dims  # per base dim: int or (start, size, stride)
        self.post = post
        self.oob = oob
        # A stride of 0 (a broadcast load) has no numpy slice: such a region is read through
        # index arrays, like an out-of-bounds one. (One pass: this runs at every access.)
        index: list = []
        out_shape: list[int] = []
        zero_stride = False  # some dimension repeats one element (`pl.ds(start, n, 0)`)
        for d in dims:
            if d.__class__ is int:
                index.append(d)
                continue
            start, size, stride = d
            out_shape.append(size)
            if size > 1 and stride == 0:
                zero_stride = True
            index.append(slice(start, start + size * stride, stride) if size > 0
                         else slice(0, 0))
        self.zero_stride = zero_stride
        self.index = tuple(index) if not oob and not zero_stride else None
        self.out_shape = tuple(out_shape)
        self._map: ElementMap | None = None

    @classmethod
    def in_bounds(cls, buffer: Buffer, dims: list, index: tuple,
                  out_shape: tuple[int, ...]) -> "Region":
        """A plain region whose numpy index is already known to be in bounds, with no
        stride of 0 (an index plan's straight-line code makes these)."""
        region = cls.__new__(cls)
        region.buffer = buffer
        region.dims = dims
        region.post = []
        region.oob = []
        region.zero_stride = False
        region.index = index
        region.out_shape = out_shape
        region._map = None
        return region

    # -- description -------------------------------------------------------------------
    def index_range(self) -> IndexRange:
        """Per base dimension [start, stop) covered (before any post transform)."""
        out = []
        for d in self.dims:
            if isinstance(d, int):
                out.append((d, d + 1))
            else:
                start, size, stride = d
                if size <= 0:
                    out.append((start, start))
                elif stride >= 0:
                    out.append((start, start + (size - 1) * stride + 1))
                else:
                    out.append((start + (size - 1) * stride, start + 1))
        return tuple(out)

    def element_map(self) -> "ElementMap":
        """Which buffer elements each element of the access is made of (post transforms
        applied: a reshaped or bitcast view), made once per view shape (cached)."""
        if self._map is None:
            self._map = element_map_of(self)
        return self._map

    def boxes(self) -> tuple[IndexRange, ...]:
        """Disjoint index ranges of the buffer that together hold exactly the elements the
        access touches: just `index_range()` without post transforms; through a reshape
        or bitcast view, as few boxes as cover its elements and nothing else (so that
        accesses to disjoint parts of a view never overlap)."""
        if not self.post:
            return (self.index_range(),)
        return self.element_map().boxes()

    def selected_range(self, selected: np.ndarray) -> IndexRange:
        """Per base dimension [start, stop) of the elements `selected` (a boolean array in
        the access's own shape) picks (their bounding box in the buffer, through post
        transforms too); the whole `index_range()` when nothing is selected."""
        selected = np.asarray(selected, bool)
        if self.post:
            box = self.element_map().bbox(selected) if selected.any() else None
            return box if box is not None else self.index_range()
        if selected.shape != self.out_shape or not selected.any():
            return self.index_range()
        out, axis = [], 0
        for d in self.dims:
            if isinstance(d, int):
                out.append((d, d + 1))
                continue
            start, _, stride = d
            others = tuple(a for a in range(selected.ndim) if a != axis)
            hit = np.nonzero(selected.any(axis=others) if others else selected)[0]
            lo, hi = start + int(hit[0]) * stride, start + int(hit[-1]) * stride
            out.append((lo, hi + 1) if stride >= 0 else (hi, lo + 1))
            axis += 1
        return tuple(out)

    # -- masked (out-of-bounds) helpers -------------------------------------------------
    def _masked_index(self) -> tuple[tuple, np.ndarray]:
        arrays, masks = [], []
        for d, n in zip(self.dims, self.buffer.shape):
            if isinstance(d, int):
                idx = np.array([d])
            else:
                idx = d[0] + d[2] * np.arange(d[1])
            valid = (idx >= 0) & (idx < n)
            arrays.append(np.clip(idx, 0, max(n - 1, 0)))
            masks.append(valid)
        mesh = np.ix_(*arrays)
        mask = np.ones((), bool)
        for axis, m in enumerate(masks):
            shape = [1] * len(masks)
            shape[axis] = m.shape[0]
            mask = mask & m.reshape(shape)
        return mesh, mask

    def _in_bounds_part(self) -> tuple[tuple, tuple, tuple[int, ...]]:
        """Where a store crossing the buffer's edge lands: the buffer index of its
        in-bounds elements, the index of those elements in the stored value (given the
        shape of `_masked_index`, ints kept as dimensions of 1) and that shape. A store
        drops only what lies outside; written through clipped indices, the clipped
        copies of the last row or column would overwrite its in-bounds value."""
        targets, sources, shape = [], [], []
        for d, n in zip(self.dims, self.buffer.shape):
            idx = np.array([d]) if isinstance(d, int) else d[0] + d[2] * np.arange(d[1])
            keep = np.nonzero((idx >= 0) & (idx < n))[0]
            targets.append(idx[keep])
            sources.append(keep)
            shape.append(idx.shape[0])
        return np.ix_(*targets), np.ix_(*sources), tuple(shape)

    def _squeeze_ints(self, arr: np.ndarray) -> np.ndarray:
        axes = tuple(i for i, d in enumerate(self.dims) if isinstance(d, int))
        return arr.reshape(tuple(s for i, s in enumerate(arr.shape) if i not in axes))

    # -- reads and writes ---------------------------------------------------------------
    def read_base(self, fill: Any) -> np.ndarray:
        """Values of the region in buffer coordinates (copy), before post transforms."""
        if self.index is not None:
            buffer = self.buffer
            values = buffer.data[self.index]
            if buffer.read_only or values.__class__ is not np.ndarray:
                return values  # never written (the view keeps these values), or one scalar
            if values.nbytes >= _SMALL_BYTES:
                lent = buffer.lend(values)
                if lent is not None:
                    return lent
            return aligned_copy(values)
        mesh, mask = self._masked_index()
        if mask.size and not mask.any():
            vals = np.full(mask.shape, fill, dtype=self.buffer.data.dtype)
        else:
            vals = np.where(mask, self.buffer.data[mesh], fill).astype(self.buffer.data.dtype)
        return self._squeeze_ints(vals)

    def written_base(self) -> np.ndarray:
        """The written-shadow of the region (out-of-bounds elements count as written)."""
        if self.buffer.fully_written:
            return np.ones(self.out_shape, bool)
        if self.index is not None:
            return self.buffer.written[self.index]
        mesh, mask = self._masked_index()
        return self._squeeze_ints(np.where(mask, self.buffer.written[mesh], True))

    def write_base(self, value: np.ndarray, written: bool | np.ndarray | None = True) -> None:
        """Store values (already in buffer coordinates); out-of-bounds elements are dropped.
        `written` becomes the shadow of the region (None: the shadow is left alone)."""
        buf = self.buffer
        data = buf.writable()
        if self.index is not None:
            data[self.index] = value
            if written is not None:
                buf.mark_written(self.index, written)
            return
        target, source, full_shape = self._in_bounds_part()
        value = np.broadcast_to(np.asarray(value, dtype=data.dtype), self.out_shape)
        data[target] = value.reshape(full_shape)[source]
        if written is None:
            return
        new_written = np.broadcast_to(np.asarray(written), self.out_shape).reshape(full_shape)
        buf.written[target] = new_written[source]
        buf.recount()

    def read(self, fill: Any) -> np.ndarray:
        value = self.read_base(fill)
        for transform in self.post:
            value = _apply_post(transform, value)
        return value

    def read_written(self) -> np.ndarray:
        """Written-shadow in the access's own coordinates (post transforms applied)."""
        written = self.written_base()
        dtype = self.buffer.data.dtype
        for transform in self.post:
            if isinstance(transform, state_types.BitcastTransform):
                written = _bitcast_shadow(written, dtype, np.dtype(transform.dtype))
                dtype = np.dtype(transform.dtype)
            else:
                written = _apply_post(transform, written)
        return written

    def write(self, value: np.ndarray, fill: Any, written: bool | np.ndarray = True,
              touched: np.ndarray | None = None) -> None:
        """Store `value` (in the access's own shape). `written`: whether the stored data
        is itself initialized (a DMA copies its source's shadow along); `touched`: the
        elements stored (a masked store), None for all; the others keep value and shadow."""
        if touched is not None:
            written = np.asarray(written, bool) & np.asarray(touched, bool)
            written = written | (self.read_written() if self.post else self.written_base())
        if not self.post:
            self.write_base(value, written)
            return
        # Slow path: recompute each stage, replace the innermost, then undo the chain.
        stages = [self.read_base(fill)]
        for transform in self.post:
            stages.append(_apply_post(transform, stages[-1]))
        new = np.asarray(value, dtype=stages[-1].dtype)
        if new.shape != stages[-1].shape and new.size == stages[-1].size:
            new = new.reshape(stages[-1].shape)  # a DMA between views of one size
        new = np.broadcast_to(new, stages[-1].shape)
        for transform, before in zip(reversed(self.post), reversed(stages[:-1])):
            new = _undo_post(transform, before, new)
        self.write_base(new, None)
        # The shadow changes exactly where the view's elements lie in the buffer.
        if isinstance(written, np.ndarray) and written.size == new.size:
            written = written.reshape(stages[-1].shape)
        self.element_map().mark(self.buffer, written)


# -- element-exact views: which buffer elements an access through post transforms touches

class ElementMap:
    """Where each element of an access through a reshape / bitcast / transpose view lies
    in its buffer, exactly.

    `units` has the access's shape plus one trailing axis: the buffer units each accessed
    element is made of, as flat indices `element * per + part`, -1 outside the buffer. A
    unit is the smallest item size along the view (a bitcast to a narrower type splits a
    buffer element into `per` parts; to a wider one, an accessed element spans several).
    Everything derived (elements, boxes) is computed once: maps are shared by every access
    through a view of the same shape (`element_map_of`).
    """

    __slots__ = ("units", "per", "shape", "_elements", "_full", "_boxes")

    def __init__(self, units: np.ndarray, per: int, shape: tuple[int, ...]) -> None:
        self.units = units
        self.per = per
        self.shape = shape  # the buffer's
        self._elements: np.ndarray | None = None
        self._full: np.ndarray | None = None
        self._boxes: tuple[IndexRange, ...] | None = None

    def _element_counts(self) -> tuple[np.ndarray, np.ndarray]:
        units = np.unique(self.units[self.units >= 0])
        return np.unique(units // self.per, return_counts=True)

    def elements(self) -> np.ndarray:
        """Flat indices (sorted) of the buffer elements the access touches, even in part."""
        if self._elements is None:
            self._elements, counts = self._element_counts()
            self._full = self._elements[counts == self.per]
        return self._elements

    def full(self) -> np.ndarray:
        """Flat indices of the buffer elements the access covers whole (every part)."""
        if self._full is None:
            self.elements()
        assert self._full is not None
        return self._full

    def boxes(self) -> tuple[IndexRange, ...]:
        if self._boxes is None:
            self._boxes = flat_boxes(self.elements(), self.shape)
        return self._boxes

    def bbox(self, selected: np.ndarray) -> IndexRange | None:
        """The bounding box in the buffer of the elements that `selected` (a boolean array
        in the access's shape) touches; None if it touches none."""
        units = self.units[np.broadcast_to(selected, self.units.shape[:-1])]
        units = units[units >= 0]
        if units.size == 0:
            return None
        coords = np.unravel_index(units // self.per, self.shape)
        return tuple((int(c.min()), int(c.max()) + 1) for c in coords)

    def mark(self, buffer: Buffer, written: bool | np.ndarray) -> None:
        """Update `buffer`'s shadow after a store through the view whose data is
        initialized where `written` (in the access's shape) says: an element stored whole
        is written iff all of its parts are; one stored in part keeps its state if the
        part is initialized and becomes unwritten if not (stale bits landed in it)."""
        if not isinstance(written, np.ndarray) or written.all():
            if bool(np.all(written)):
                buffer.mark_flat(self.full(), True)
                return
            buffer.mark_flat(self.elements(), False)
            return
        units = self.units.reshape(-1, self.units.shape[-1])
        written = np.broadcast_to(np.asarray(written, bool), self.units.shape[:-1])
        good = np.broadcast_to(written.reshape(-1, 1), units.shape)
        valid = units >= 0
        elements, where, parts = np.unique(units[valid] // self.per, return_inverse=True,
                                           return_counts=True)
        good_parts = np.bincount(where, weights=good[valid], minlength=len(elements))
        clean = good_parts == parts
        buffer.mark_flat(elements[clean & (parts == self.per)], True)
        buffer.mark_flat(elements[~clean], False)


def flat_boxes(elements: np.ndarray, shape: tuple[int, ...]) -> tuple[IndexRange, ...]:
    """Disjoint boxes of a buffer of `shape` that hold exactly the elements at flat
    indices `elements` (sorted, distinct): one box when they form one (the usual case),
    else runs of equal slices along the leading dimension, split further inside."""
    if elements.size == 0:
        return (tuple((0, 0) for _ in shape),)
    coords = np.unravel_index(elements, shape)
    lo = [int(c.min()) for c in coords]
    hi = [int(c.max()) + 1 for c in coords]
    if math.prod(h - low for low, h in zip(lo, hi)) == elements.size:
        return (tuple(zip(lo, hi)),)
    mask = np.zeros(tuple(h - low for low, h in zip(lo, hi)), bool)
    mask[tuple(c - low for c, low in zip(coords, lo))] = True
    return tuple(tuple((low + a, low + b) for low, (a, b) in zip(lo, box))
                 for box in _mask_boxes(mask))


def _mask_boxes(mask: np.ndarray) -> list[IndexRange]:
    """Disjoint boxes covering exactly the True elements of `mask`."""
    if mask.ndim == 0:
        return [()] if bool(mask) else []
    if mask.all():
        return [tuple((0, n) for n in mask.shape)]
    flat = mask.reshape(mask.shape[0], -1)
    # Runs of consecutive equal slices along axis 0 share their boxes inside.
    starts = [0] + [i for i in range(1, flat.shape[0])
                    if not np.array_equal(flat[i], flat[i - 1])] + [flat.shape[0]]
    out: list[IndexRange] = []
    for a, b in zip(starts, starts[1:]):
        if flat[a].any():
            out.extend(((a, b), *inner) for inner in _mask_boxes(mask[a]))
    return out


_MAP_UNITS = 1 << 22  # units kept in cached maps at most (4 bytes each, or 8)


class _MapCache:
    """Element maps by view shape, bounded by their total size (least recent out)."""

    def __init__(self) -> None:
        self._items: collections.OrderedDict[Any, ElementMap] = collections.OrderedDict()
        self._units = 0
        self._lock = threading.Lock()

    def get(self, key: Any) -> ElementMap | None:
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    def put(self, key: Any, value: ElementMap) -> None:
        with self._lock:
            if key in self._items or value.units.size > _MAP_UNITS:
                return
            self._items[key] = value
            self._units += value.units.size
            while self._units > _MAP_UNITS:
                _, old = self._items.popitem(last=False)
                self._units -= old.units.size


_maps = _MapCache()


def _post_key(post: list) -> tuple | None:
    """A hashable spelling of post transforms (None: not cacheable, e.g. index arrays)."""
    key: list = []
    for t in post:
        if isinstance(t, state_indexing.NDIndexer):
            if has_array_index(t):
                return None
            key.append(tuple((_as_int(i.start), _as_int(i.size), int(i.stride))
                             if isinstance(i, state_indexing.Slice) else _as_int(i)
                             for i in t.indices))
        elif isinstance(t, state_types.ReshapeTransform):
            key.append(("reshape", tuple(t.shape)))
        elif isinstance(t, state_types.BitcastTransform):
            key.append(("bitcast", np.dtype(t.dtype).str))
        elif isinstance(t, state_types.TransposeTransform):
            key.append(("transpose", tuple(t.permutation)))
        else:
            raise UnsupportedTransform(type(t).__name__)
    return tuple(key)


def element_map_of(region: Region) -> ElementMap:
    """The element map of a region with post transforms (cached by view shape)."""
    buffer = region.buffer
    post_key = _post_key(region.post)
    key = None if post_key is None else (
        buffer.shape, buffer.data.dtype.str, tuple(region.dims), post_key)
    found = _maps.get(key) if key is not None else None
    if found is not None:
        return found
    made = _build_map(buffer.shape, buffer.data.dtype, region.dims, region.post)
    if key is not None:
        _maps.put(key, made)
    return made


def _build_map(shape: tuple[int, ...], dtype: np.dtype, dims: list, post: list) -> ElementMap:
    sizes = [dtype.itemsize] + [np.dtype(t.dtype).itemsize for t in post
                                if isinstance(t, state_types.BitcastTransform)]
    per = dtype.itemsize // math.gcd(*sizes)
    strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
    flat, valid = np.zeros((), np.int64), np.ones((), bool)
    for d, n, stride in zip(dims, shape, strides):
        if isinstance(d, int):
            flat, valid = flat + d * stride, valid & (0 <= d < n)
        else:
            idx = d[0] + d[2] * np.arange(d[1], dtype=np.int64)
            flat = flat[..., None] + idx * stride
            valid = valid[..., None] & (idx >= 0) & (idx < n)
    units = np.where(valid[..., None], flat[..., None] * per + np.arange(per), -1)
    itemsize = dtype.itemsize
    for t in post:
        lead = units.ndim - 1
        if isinstance(t, state_indexing.NDIndexer):
            units = units[_numpy_index(t) + (slice(None),)]
        elif isinstance(t, state_types.ReshapeTransform):
            units = units.reshape(tuple(t.shape) + units.shape[-1:])
        elif isinstance(t, state_types.TransposeTransform):
            units = np.transpose(units, tuple(t.permutation) + (lead,))
        else:  # a bitcast (anything else was refused by _post_key)
            new_size = np.dtype(t.dtype).itemsize
            units, itemsize = _bitcast_units(units, itemsize, new_size), new_size
    if units.size and int(units.max()) < 2**31:
        units = units.astype(np.int32)
    return ElementMap(units, per, tuple(shape))


def _bitcast_units(units: np.ndarray, src: int, dst: int) -> np.ndarray:
    """The units of a view bitcast from item size `src` to `dst`, laid out as
    `tpu_bitcast` lays out values (packing along the second-minor dimension)."""
    if src == dst:
        return units
    *lead, m, n, k = units.shape
    if dst > src:  # `p` rows of the narrow type pack into one: their bytes in row order
        p = dst // src
        return units.reshape(*lead, m // p, p, n, k).swapaxes(-3, -2).reshape(
            *lead, m // p, n, p * k)
    q = src // dst  # one row splits into `q`: row r * q + s holds the s-th part
    return units.reshape(*lead, m, n, q, k // q).swapaxes(-3, -2).reshape(
        *lead, m * q, n, k // q)


# -- transforms after a non-indexing step ---------------------------------------------

def _apply_post(transform: Any, value: np.ndarray) -> np.ndarray:
    if isinstance(transform, state_indexing.NDIndexer):
        return value[_numpy_index(transform)]
    if isinstance(transform, state_types.ReshapeTransform):
        return value.reshape(transform.shape)
    if isinstance(transform, state_types.BitcastTransform):
        return tpu_bitcast(value, np.dtype(transform.dtype))
    if isinstance(transform, state_types.TransposeTransform):
        return np.transpose(value, transform.permutation)
    raise UnsupportedTransform(type(transform).__name__)


def _bitcast_shadow(written: np.ndarray, src: np.dtype, dst: np.dtype) -> np.ndarray:
    src_bits, dst_bits = src.itemsize * 8, np.dtype(dst).itemsize * 8
    if src_bits == dst_bits:
        return written
    *lead, m, n = written.shape
    if src_bits < dst_bits:
        packing = dst_bits // src_bits
        return written.reshape(*lead, m // packing, packing, n).all(axis=-2)
    return np.repeat(written, src_bits // dst_bits, axis=-2)


def _undo_post(transform: Any, before: np.ndarray, new: np.ndarray) -> np.ndarray:
    if isinstance(transform, state_indexing.NDIndexer):
        out = np.array(before)
        out[_numpy_index(transform)] = new
        return out
    if isinstance(transform, state_types.ReshapeTransform):
        return new.reshape(before.shape)
    if isinstance(transform, state_types.BitcastTransform):
        return tpu_bitcast(new, before.dtype)
    if isinstance(transform, state_types.TransposeTransform):
        inverse = np.argsort(transform.permutation)
        return np.transpose(new, inverse)
    raise UnsupportedTransform(type(transform).__name__)


def tpu_bitcast(value: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Bitcast as the TPU does: packing changes the second-minor dimension."""
    src_bits = value.dtype.itemsize * 8
    dst_bits = np.dtype(dtype).itemsize * 8
    if src_bits == dst_bits:
        return value.view(dtype)
    *lead, m, n = value.shape
    if src_bits < dst_bits:
        packing = dst_bits // src_bits
        packed = value.reshape(*lead, m // packing, packing, n).swapaxes(-1, -2)
        return np.ascontiguousarray(packed).view(dtype).reshape(*lead, m // packing, n)
    packing = src_bits // dst_bits
    unpacked = np.ascontiguousarray(value).view(dtype).reshape(*lead, m, n, packing)
    return unpacked.swapaxes(-1, -2).reshape(*lead, m * packing, n)


class UnsupportedTransform(Exception):
    """A ref transform pallas-check does not model."""


def _numpy_index(indexer: Any) -> tuple:
    out = []
    for idx in indexer.indices:
        if isinstance(idx, state_indexing.Slice):
            start, size, stride = int(idx.start), int(idx.size), int(idx.stride)
            out.append(slice(start, start + size * stride, stride))
        else:
            out.append(np.asarray(idx))
    return tuple(out)


def _as_int(x: Any) -> int:
    return int(np.asarray(x))


def resolve(view: RefView) -> Region:
    """Turn a ref view into the region of its buffer that an access touches."""
    steps: list[tuple] = []
    post: list = []
    for transform in view.transforms:
        if post or not isinstance(transform, state_indexing.NDIndexer) or has_array_index(
            transform
        ):
            post.append(transform)
            continue
        steps.append(tuple(
            (_as_int(idx.start), _as_int(idx.size), int(idx.stride))
            if isinstance(idx, state_indexing.Slice) else _as_int(idx)
            for idx in transform.indices))
    return index_region(view.buffer, steps, post)


def index_region(buffer: Buffer, steps: Sequence[tuple], post: list | None = None) -> Region:
    """The region that plain indexers select, one after the other, in `buffer`: each step
    gives, per dimension still there, an int or (start, size, stride); `post` holds the
    transforms applied after them."""
    dims: list = [(0, n, 1) for n in buffer.data.shape]
    oob: list[OutOfBounds] = []
    live: Sequence[int] = range(len(dims))  # the base dims not yet taken by an int index
    for indices in steps:
        if len(indices) != len(live):
            raise UnsupportedTransform(
                f"indexer of rank {len(indices)} on a view of rank {len(live)}"
            )
        still: list[int] = []
        for base_dim, idx in zip(live, indices):
            start0, size0, stride0 = dims[base_dim]
            if idx.__class__ is int:
                if idx < 0 or idx >= size0:
                    oob.append(OutOfBounds(base_dim, str(idx), size0))
                dims[base_dim] = start0 + idx * stride0
                continue
            start, size, stride = idx
            if size < 0:  # a traced size below zero: a DMA of no defined extent
                oob.append(OutOfBounds(base_dim, f"{start}:{start + size} (size {size})", size0))
            elif size > 0 and (start < 0 or start + (size - 1) * stride >= size0):
                where = (f"{start} (stride 0, {size} times)" if stride == 0 else
                         f"{start}:{start + size * stride}"
                         + (f":{stride}" if stride != 1 else ""))
                oob.append(OutOfBounds(base_dim, where, size0))
            dims[base_dim] = (start0 + start * stride0, size, stride0 * stride)
            still.append(base_dim)
        live = still
    return Region(buffer, dims, post if post is not None else [], oob)


def has_array_index(indexer: Any) -> bool:
    for idx in indexer.indices:
        if not isinstance(idx, state_indexing.Slice) and np.ndim(idx) > 0:
            return True
    return False
