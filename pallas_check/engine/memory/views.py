"""Ref views through transforms: which buffer elements a bitcast, reshaped or
indexed view touches (`ElementMap`), and how a value moves through the transforms.
"""

from __future__ import annotations

import collections
import math
import threading
from typing import Generic, TypeVar, cast

import numpy as np

from pallas_check.jaxbridge.types import (BitcastTransform, NDIndexer, ReshapeTransform, Slice,
                                          Transform, TransposeTransform)
from pallas_check.engine.memory.buffer import Buffer, IndexDim
from pallas_check.findings.finding import IndexRange


class ElementMap:
    """Where each element of an access through a reshape / bitcast / transpose view lies
    in its buffer, exactly.

    `units` has the access's shape plus one trailing axis: the buffer units each accessed
    element is made of, as flat indices `element * per + part`, -1 outside the buffer. A
    unit is the smallest item size along the view (a bitcast to a narrower type splits a
    buffer element into `per` parts; to a wider one, an accessed element spans several).
    Everything derived (elements, boxes) is computed once: maps are shared by every access
    through a view of the same shape (`element_map_of`, region.py).
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
        self._items: collections.OrderedDict[tuple[object, ...], ElementMap] = (
            collections.OrderedDict())
        self._units = 0
        self._lock = threading.Lock()

    def get(self, key: tuple[object, ...]) -> ElementMap | None:
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    def put(self, key: tuple[object, ...], value: ElementMap) -> None:
        with self._lock:
            if key in self._items or value.units.size > _MAP_UNITS:
                return
            self._items[key] = value
            self._units += value.units.size
            while self._units > _MAP_UNITS:
                _, old = self._items.popitem(last=False)
                self._units -= old.units.size


_maps = _MapCache()


# The transform a `_ViewTransform` subclass describes (its `t`).
_T = TypeVar("_T", bound=Transform)


class _ViewTransform(Generic[_T]):
    """What the engine does with one kind of ref transform applied after the plain
    indexers (a view): the ONE place a transform kind is described. A new kind of
    transform is one subclass here and one entry in `_TRANSFORMS`."""

    @staticmethod
    def key(t: _T) -> tuple[object, ...] | None:
        """A hashable spelling for the element-map cache (None: not cacheable)."""
        raise NotImplementedError

    @staticmethod
    def apply(t: _T, value: np.ndarray) -> np.ndarray:
        """The view's value from the value beneath it."""
        raise NotImplementedError

    @staticmethod
    def undo(t: _T, before: np.ndarray, new: np.ndarray) -> np.ndarray:
        """The value beneath once the view's value became `new` (`before`: what it was)."""
        raise NotImplementedError

    @classmethod
    def shadow(cls, t: _T, written: np.ndarray, dtype: np.dtype
               ) -> tuple[np.ndarray, np.dtype]:
        """The written-shadow seen through the view, and the element type there."""
        return cls.apply(t, written), dtype

    @classmethod
    def units(cls, t: _T, units: np.ndarray, itemsize: int
              ) -> tuple[np.ndarray, int]:
        """An element map's units (trailing axis: the parts of one element) through the
        view, and the item size there."""
        return cls.apply(t, units), itemsize

    @staticmethod
    def itemsize(t: _T) -> int | None:
        """The item size the view changes to (None: unchanged)."""
        return None

    @staticmethod
    def dtype(t: _T, dtype: np.dtype) -> np.dtype:
        """The element type seen through the view of elements of `dtype`."""
        return dtype


class _Index(_ViewTransform[NDIndexer]):
    @staticmethod
    def key(t: NDIndexer) -> tuple[object, ...] | None:
        if has_array_index(t):
            return None
        return tuple((_as_int(i.start), _as_int(i.size), int(i.stride))
                     if isinstance(i, Slice) else _as_int(i)
                     for i in t.indices)

    @staticmethod
    def apply(t: NDIndexer, value: np.ndarray) -> np.ndarray:
        return value[_numpy_index(t)]

    @staticmethod
    def undo(t: NDIndexer, before: np.ndarray, new: np.ndarray) -> np.ndarray:
        out = np.array(before)
        out[_numpy_index(t)] = new
        return out

    @classmethod
    def units(cls, t: NDIndexer, units: np.ndarray, itemsize: int
              ) -> tuple[np.ndarray, int]:
        return units[_numpy_index(t) + (slice(None),)], itemsize


class _Reshape(_ViewTransform[ReshapeTransform]):
    @staticmethod
    def key(t: ReshapeTransform) -> tuple[object, ...] | None:
        return ("reshape", tuple(t.shape))

    @staticmethod
    def apply(t: ReshapeTransform, value: np.ndarray) -> np.ndarray:
        return value.reshape(t.shape)

    @staticmethod
    def undo(t: ReshapeTransform, before: np.ndarray, new: np.ndarray) -> np.ndarray:
        return new.reshape(before.shape)

    @classmethod
    def units(cls, t: ReshapeTransform, units: np.ndarray, itemsize: int
              ) -> tuple[np.ndarray, int]:
        return units.reshape(tuple(t.shape) + units.shape[-1:]), itemsize


class _Transpose(_ViewTransform[TransposeTransform]):
    @staticmethod
    def key(t: TransposeTransform) -> tuple[object, ...] | None:
        return ("transpose", tuple(t.permutation))

    @staticmethod
    def apply(t: TransposeTransform, value: np.ndarray) -> np.ndarray:
        return np.transpose(value, t.permutation)

    @staticmethod
    def undo(t: TransposeTransform, before: np.ndarray, new: np.ndarray) -> np.ndarray:
        return np.transpose(new, np.argsort(t.permutation))

    @classmethod
    def units(cls, t: TransposeTransform, units: np.ndarray, itemsize: int
              ) -> tuple[np.ndarray, int]:
        return np.transpose(units, tuple(t.permutation) + (units.ndim - 1,)), itemsize


class _Bitcast(_ViewTransform[BitcastTransform]):
    @staticmethod
    def key(t: BitcastTransform) -> tuple[object, ...] | None:
        return ("bitcast", np.dtype(t.dtype).str)

    @staticmethod
    def apply(t: BitcastTransform, value: np.ndarray) -> np.ndarray:
        return tpu_bitcast(value, np.dtype(t.dtype))

    @staticmethod
    def undo(t: BitcastTransform, before: np.ndarray, new: np.ndarray) -> np.ndarray:
        return tpu_bitcast(new, before.dtype)

    @classmethod
    def shadow(cls, t: BitcastTransform, written: np.ndarray, dtype: np.dtype
               ) -> tuple[np.ndarray, np.dtype]:
        return _bitcast_shadow(written, dtype, np.dtype(t.dtype)), np.dtype(t.dtype)

    @classmethod
    def units(cls, t: BitcastTransform, units: np.ndarray, itemsize: int
              ) -> tuple[np.ndarray, int]:
        new_size = np.dtype(t.dtype).itemsize
        return _bitcast_units(units, itemsize, new_size), new_size

    @staticmethod
    def itemsize(t: BitcastTransform) -> int | None:
        return np.dtype(t.dtype).itemsize

    @staticmethod
    def dtype(t: BitcastTransform, dtype: np.dtype) -> np.dtype:
        return np.dtype(t.dtype)


# The transform kinds a view may have, and what each does (`_ViewTransform`).
# A table cannot tie each entry's key to its value's `_T`: an entry is looked up by the
# type of the very transform it is then given (`view_transform`), so it is stored as one
# taking any transform.
_Kind = _ViewTransform[Transform]
_TRANSFORMS: dict[type, type[_Kind]] = {
    NDIndexer: cast("type[_Kind]", _Index),
    ReshapeTransform: cast("type[_Kind]", _Reshape),
    TransposeTransform: cast("type[_Kind]", _Transpose),
    BitcastTransform: cast("type[_Kind]", _Bitcast),
}


def view_transform(t: Transform) -> type[_Kind]:
    """The table's entry for a transform; one the engine does not model is refused."""
    kind = _TRANSFORMS.get(type(t))
    if kind is None:  # a subclass of a kind in the table is that kind
        kind = next((rule for cls, rule in _TRANSFORMS.items() if isinstance(t, cls)), None)
        if kind is None:
            raise UnsupportedTransform(type(t).__name__)
    return kind


def view_dtype(dtype: np.dtype, post: list[Transform]) -> np.dtype:
    """The element type of a view of a buffer of `dtype` through the transforms `post`
    (a bitcast changes it), without evaluating the view."""
    for t in post:
        dtype = view_transform(t).dtype(t, dtype)
    return np.dtype(dtype)


def same_bits(value: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """`value` as elements of `dtype`, bit for bit (what a DMA moves is bytes, never a
    conversion): one element type of the same size seen as the other (a uint32 DMA
    into an int32 ref). A size that differs is the caller's to have refused."""
    if value.dtype == dtype:
        return value
    if value.dtype.itemsize != np.dtype(dtype).itemsize:
        raise ValueError(f"{value.dtype} and {dtype} differ in size: no bit-exact view")
    return value.view(dtype)


def mosaic_element(dtype: np.dtype) -> str:
    """How Mosaic's verifier names an element type: integers are signless (int32 and
    uint32 are both i32), floats by their name (f32, bf16 and f16 differ)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        return f"i{dtype.itemsize * 8}"
    return dtype.name


def _post_key(post: list[Transform]) -> tuple[object, ...] | None:
    """A hashable spelling of post transforms (None: not cacheable, e.g. index arrays)."""
    key: list[object] = []
    for t in post:
        part = view_transform(t).key(t)
        if part is None:
            return None
        key.append(part)
    return tuple(key)


def _build_map(shape: tuple[int, ...], dtype: np.dtype, dims: list[IndexDim],
               post: list[Transform]) -> ElementMap:
    sizes = [dtype.itemsize] + [size for t in post
                                if (size := view_transform(t).itemsize(t)) is not None]
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
        units, itemsize = view_transform(t).units(t, units, itemsize)
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


def _apply_post(transform: Transform, value: np.ndarray) -> np.ndarray:
    return view_transform(transform).apply(transform, value)


def _bitcast_shadow(written: np.ndarray, src: np.dtype, dst: np.dtype) -> np.ndarray:
    src_bits, dst_bits = src.itemsize * 8, np.dtype(dst).itemsize * 8
    if src_bits == dst_bits:
        return written
    *lead, m, n = written.shape
    if src_bits < dst_bits:
        packing = dst_bits // src_bits
        # (numpy's stubs type `all` as maybe a scalar; with an axis it is an array)
        return cast(np.ndarray, written.reshape(*lead, m // packing, packing, n).all(axis=-2))
    return np.repeat(written, src_bits // dst_bits, axis=-2)


def _undo_post(transform: Transform, before: np.ndarray, new: np.ndarray) -> np.ndarray:
    return view_transform(transform).undo(transform, before, new)


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


def _numpy_index(indexer: NDIndexer) -> tuple[slice | np.ndarray, ...]:
    out: list[slice | np.ndarray] = []
    for idx in indexer.indices:
        if isinstance(idx, Slice):
            start, size, stride = int(idx.start), int(idx.size), int(idx.stride)
            out.append(slice(start, start + size * stride, stride))
        else:
            out.append(np.asarray(idx))
    return tuple(out)


def _as_int(x: object) -> int:
    return int(np.asarray(x))


def has_array_index(indexer: NDIndexer) -> bool:
    for idx in indexer.indices:
        if not isinstance(idx, Slice) and np.ndim(idx) > 0:
            return True
    return False
