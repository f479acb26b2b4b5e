"""Where an access lands: a `RefView` resolved to a `Region` of its buffer, which
says which elements are touched (for bounds, the written-shadow and races) and gives a fast
numpy path for the common in-bounds, plain-indexing case.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from pallas_check.jaxbridge.types import NDIndexer, Slice, Transform
from pallas_check.engine.memory.buffer import (Buffer, IndexDim, RefView, _SMALL_BYTES,
                                               aligned_copy)
from pallas_check.engine.memory.tiling import padded_shape
from pallas_check.engine.memory.views import (ElementMap, UnsupportedTransform, _apply_post,
                                              _as_int, _build_map, _maps,
                                              _post_key, _undo_post, has_array_index,
                                              view_dtype, view_transform)
from pallas_check.findings.finding import IndexRange


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

    __slots__ = ("buffer", "index", "post", "oob", "dims", "out_shape", "zero_stride", "_map",
                 "_boxes", "padded")

    def __init__(self, buffer: Buffer, dims: list[IndexDim],
                 post: list[Transform], oob: list[OutOfBounds],
                 padded: bool = False) -> None:
        self.buffer = buffer
        self.dims = dims  # per base dim: int or (start, size, stride)
        self.post = post
        self.oob = oob
        # Past the buffer's shape only into its tile padding (a DMA of a ragged block,
        # engine/memory/tiling.py): read through index arrays as an out-of-bounds region
        # is, the padding never written, but no out-of-bounds finding.
        self.padded = padded
        # A stride of 0 (a broadcast load) has no numpy slice: such a region is read through
        # index arrays, like an out-of-bounds one. (One pass: this runs at every access.)
        index: list[int | slice] = []
        out_shape: list[int] = []
        zero_stride = False  # some dimension repeats one element (`pl.ds(start, n, 0)`)
        for d in dims:
            if d.__class__ is int:
                index.append(d)
                continue
            # `d` is a (start, size, stride) here; mypy does not narrow on `__class__`, and
            # `isinstance` would cost every dimension of every access.
            start, size, stride = d  # type: ignore[misc]
            out_shape.append(size)
            if size > 1 and stride == 0:
                zero_stride = True
            index.append(slice(start, start + size * stride, stride) if size > 0
                         else slice(0, 0))
        self.zero_stride = zero_stride
        self.index = tuple(index) if not oob and not zero_stride and not padded else None
        self.out_shape = tuple(out_shape)
        self._map: ElementMap | None = None
        self._boxes: tuple[IndexRange, ...] | None = None

    @classmethod
    def in_bounds(cls, buffer: Buffer, dims: list[IndexDim], index: tuple[int | slice, ...],
                  out_shape: tuple[int, ...]) -> "Region":
        """A plain region whose numpy index is already known to be in bounds, with no
        stride of 0 (an index plan's straight-line code makes these)."""
        region = cls.__new__(cls)
        region.buffer = buffer
        region.dims = dims
        region.post = []
        region.oob = []
        region.zero_stride = False
        region.padded = False
        region.index = index
        region.out_shape = out_shape
        region._map = None
        region._boxes = None
        return region

    def of(self, buffer: Buffer) -> "Region":
        """The same region of another buffer of the same shape and memory space (what a
        region is depends on nothing else): the access cache keeps one region per
        equation and index values for the private buffers of many cores alike (rules/
        access.py `_region_of`). Its parts are shared, never changed after they are made;
        the boxes are made first, so that each copy need not make them again."""
        if buffer is self.buffer:
            return self
        if self._boxes is None:
            self.boxes()
        region = Region.__new__(Region)
        region.buffer = buffer
        region.dims = self.dims
        region.post = self.post
        region.oob = self.oob
        region.zero_stride = self.zero_stride
        region.padded = self.padded
        region.index = self.index
        region.out_shape = self.out_shape
        region._map = self._map
        region._boxes = self._boxes
        return region

    # -- description -------------------------------------------------------------------
    def index_range(self) -> IndexRange:
        """Per base dimension [start, stop) covered (before any post transform)."""
        out = []
        for d in self.dims:
            if isinstance(d, int):
                out.append((d, d + 1))
                continue
            start, size, stride = d
            if stride == 1 and size > 0:
                out.append((start, start + size))
            elif size <= 0:
                out.append((start, start))
            elif stride >= 0:
                out.append((start, start + (size - 1) * stride + 1))
            else:
                out.append((start + (size - 1) * stride, start + 1))
        return self._clipped(tuple(out)) if self.padded else tuple(out)

    def _clipped(self, index_range: IndexRange) -> IndexRange:
        """A range cut to the buffer's shape: what a region reaching into tile padding
        touches of the array itself (the padding is no one's data)."""
        return tuple((min(max(lo, 0), n), min(max(hi, 0), n))
                     for (lo, hi), n in zip(index_range, self.buffer.shape))

    def inside(self) -> np.ndarray:
        """Which elements of the access (its own shape) lie inside the buffer."""
        _, mask = self._masked_index()
        return np.broadcast_to(self._squeeze_ints(mask), self.out_shape)

    def view_dtype(self) -> np.dtype:
        """The element type of the access: its buffer's, or its view's (a bitcast)."""
        dtype = self.buffer.data.dtype
        return view_dtype(dtype, self.post) if self.post else dtype

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
        accesses to disjoint parts of a view never overlap). Made once per region: a
        region is kept for the same equation and index values (access_cache.py), and the
        race checker asks at every access."""
        boxes = self._boxes
        if boxes is None:
            boxes = self._boxes = ((self.index_range(),) if not self.post
                                   else self.element_map().boxes())
        return boxes

    def selected_range(self, selected: np.ndarray) -> IndexRange:
        """Per base dimension [start, stop) of the elements `selected` (a boolean array in
        the access's own shape) picks (their bounding box in the buffer, through post
        transforms too); the whole `index_range()` when nothing is selected."""
        selected = np.asarray(selected, bool)
        if self.post:
            box = self.element_map().bbox(selected) if selected.any() else None
            return box if box is not None else self.index_range()
        if selected.shape != self.out_shape or not selected.any() or selected.all():
            return self.index_range()  # (all of it: the box is the access's own)
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
        return self._clipped(tuple(out)) if self.padded else tuple(out)

    # -- masked (out-of-bounds) helpers -------------------------------------------------
    def _masked_index(self) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
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

    def _in_bounds_part(self) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...],
                                       tuple[int, ...]]:
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
    def read_base(self, fill: np.ndarray | float) -> np.ndarray:
        """Values of the region in buffer coordinates (copy), before post transforms."""
        if self.index is not None:
            buffer = self.buffer
            values: np.ndarray = buffer.data[self.index]
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
        """The written-shadow of the region (out-of-bounds elements count as written; tile
        padding as never written: what it holds is undefined)."""
        if self.padded:
            mesh, mask = self._masked_index()
            return self._squeeze_ints(mask & self.buffer.written_at(mesh))
        if self.buffer.fully_written:
            return np.ones(self.out_shape, bool)
        if self.index is not None:
            shadow: np.ndarray = self.buffer.written[self.index]
            return shadow
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

    def read(self, fill: np.ndarray | float) -> np.ndarray:
        value = self.read_base(fill)
        for transform in self.post:
            value = _apply_post(transform, value)
        return value

    def read_written(self) -> np.ndarray:
        """Written-shadow in the access's own coordinates (post transforms applied)."""
        written = self.written_base()
        dtype = self.buffer.data.dtype
        for transform in self.post:
            written, dtype = view_transform(transform).shadow(transform, written, dtype)
        return written

    def write(self, value: np.ndarray, fill: np.ndarray | float, written: bool | np.ndarray = True,
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


def resolve(view: RefView) -> Region:
    """Turn a ref view into the region of its buffer that an access touches."""
    steps: list[tuple[IndexDim, ...]] = []
    post: list[Transform] = []
    for transform in view.transforms:
        if post or not isinstance(transform, NDIndexer) or has_array_index(
            transform
        ):
            post.append(transform)
            continue
        steps.append(tuple(
            (_as_int(idx.start), _as_int(idx.size), int(idx.stride))
            if isinstance(idx, Slice) else _as_int(idx)
            for idx in transform.indices))
    return index_region(view.buffer, steps, post)


def index_region(buffer: Buffer, steps: Sequence[Sequence[IndexDim]],
                 post: list[Transform] | None = None
                 ) -> Region:
    """The region that plain indexers select, one after the other, in `buffer`: each step
    gives, per dimension still there, an int or (start, size, stride); `post` holds the
    transforms applied after them."""
    dims: list[IndexDim] = [(0, n, 1) for n in buffer.data.shape]
    oob: list[OutOfBounds] = []
    live: Sequence[int] = range(len(dims))  # the base dims not yet taken by an int index
    for indices in steps:
        if len(indices) != len(live):
            raise UnsupportedTransform(
                f"indexer of rank {len(indices)} on a view of rank {len(live)}"
            )
        still: list[int] = []
        for base_dim, idx in zip(live, indices):
            # A live dimension is a range; `idx` past the int test too (mypy does not
            # narrow on `__class__`, and `isinstance` would cost every index of every access).
            start0, size0, stride0 = dims[base_dim]  # type: ignore[misc]
            if idx.__class__ is int:
                if idx < 0 or idx >= size0:
                    oob.append(OutOfBounds(base_dim, str(idx), size0))
                dims[base_dim] = start0 + idx * stride0
                continue
            start, size, stride = idx  # type: ignore[misc]
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


def view_shape(region: Region) -> tuple[int, ...]:
    """The shape of the access, its view's (post transforms applied: a reshape, a bitcast
    that packs rows, an index after them), from its element map (cached by view shape)."""
    if not region.post:
        return region.out_shape
    return region.element_map().units.shape[:-1]


def in_tile_padding(region: Region) -> Region | None:
    """The region as one reaching into its buffer's tile padding (engine/memory/
    tiling.py), when every index past the buffer's shape lies in the padding: a plain
    region (no view transforms) whose slices stay in the padded extent; else None (it
    is out of bounds)."""
    if not region.oob or region.post or region.zero_stride:
        return None
    buffer = region.buffer
    padded = padded_shape(buffer.shape, buffer.data.dtype, buffer.space)
    if padded == tuple(buffer.shape):
        return None
    for d, extent in zip(region.dims, padded):
        if d.__class__ is int:
            if not 0 <= d < extent:
                return None
            continue
        start, size, stride = d  # type: ignore[misc]  # a range (as in Region.__init__)
        if size < 0:
            return None
        last = start + (size - 1) * stride
        if size and not (0 <= min(start, last) and max(start, last) < extent):
            return None
    return Region(buffer, list(region.dims), [], [], padded=True)


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


def masked_out_of_bounds(region: Region, mask: np.ndarray) -> bool:
    """Whether any element a masked access selects lies outside its buffer (a masked load
    or store whose mask keeps out every index outside touches nothing out of bounds)."""
    valid = np.ones((), bool)
    shapes = []
    for d, n in zip(region.dims, region.buffer.shape):
        if isinstance(d, int):
            continue
        idx = d[0] + d[2] * np.arange(d[1])
        shapes.append(((idx >= 0) & (idx < n)))
    for axis, m in enumerate(shapes):
        shape = [1] * len(shapes)
        shape[axis] = m.shape[0]
        valid = valid & m.reshape(shape)
    scalar_oob = any(isinstance(d, int) and not (0 <= d < n)
                     for d, n in zip(region.dims, region.buffer.shape))
    mask = np.broadcast_to(mask, region.out_shape)
    if scalar_oob:
        return bool(mask.any())
    return bool((mask & ~np.broadcast_to(valid, mask.shape)).any())
