"""Indirect DMAs (SparseCore gathers and scatters): `pltpu.async_copy(x.at[idx], dst, sem)`
moves the rows of `x` that an index vector names, `async_copy(src, y.at[idx], sem)` writes
rows of `y` there, `add=True` adds instead of storing (an atomic read-modify-write per
element), and `plsc.Indices(idx, ignored_value=v)` skips the rows whose index is `v`.

Semantics (derived from jax/_src/pallas/mosaic/sc_lowering.py, which lowers them to
`tpu.enqueue_indirect_dma` / `tpu.wait_indirect_dma`):
- only the HBM or VMEM_SHARED side is indexed, the other side is VMEM; the indexer is the
  last transform of its ref and indexes the major dimension of the view before it (the
  minor dimensions keep their slices); the index vector is 1-D int32 (a VMEM ref, a slice
  of one, or a vector value) with as many elements as the other side has rows;
- each ACTIVE element i (not the ignored value) moves row i of the plain side to/from row
  idx[i] of the indexed side; an ignored element moves nothing: that row is not read, not
  written, not bounds-checked, and not counted;
- an active index outside the indexed view is `out-of-bounds` naming the index vector's
  element, its value and the DMA's line; that row is not moved (the rest is);
- a plain scatter with one row named twice stores the later element (numpy order); a
  scatter-add accumulates every element (`np.add.at`);
- the semaphore counts the bytes actually moved (active, in-bounds rows x row bytes); a
  wait of an indirect DMA (whose Mosaic op names the whole refs, no offsets, no filter)
  takes the bytes of the oldest indirect DMA on that semaphore not yet waited, i.e. what
  that DMA moved (engine/rules/dma.py `_indirect_wait`).

The DMA itself is an ordinary `Dma` (engine/dma/engine.py) whose source and destination
are `RowsRegion`s: the DMA modes (engine/dma/policy.py) drive it as any other. Its race
accesses are one box per run of consecutive rows; a scatter-add's writes are atomic adds
(two never race with each other; either races with a plain read or write).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from pallas_check.jaxbridge.types import NDIndexer, Slice, TransformedRef
from pallas_check.engine.jaxpr.halts import KernelError
from pallas_check.engine.jaxpr.mosaic_limits import indirect_indexer
from pallas_check.engine.memory.buffer import RefView
from pallas_check.engine.memory.region import OutOfBounds, Region
from pallas_check.engine.memory.views import ElementMap, flat_boxes
from pallas_check.findings.finding import IndexRange, format_range


def indexed_side(src: object, dst: object) -> int | None:
    """Which argument of a DMA start (its pytree over the equation's vars) an index vector
    indexes: 0 the source (a gather), 1 the destination (a scatter), None (a plain DMA)."""
    for side, ref in enumerate((src, dst)):
        transforms: list[object] = []
        while isinstance(ref, TransformedRef):
            transforms[:0] = ref.transforms
            ref = ref.ref
        if indirect_indexer(transforms) is not None:
            return side
    return None


@dataclasses.dataclass(frozen=True)
class IndexVector:
    """The index vector of an indirect DMA, read at its start: its values, which of them
    are active, and how a finding names it (`idx_v`, `idx_v[8:16]`, `an index array`)."""

    values: np.ndarray
    active: np.ndarray
    name: str


class RowsRegion:
    """Some rows (the major dimension) of a plain view, in a given order: the side of an
    indirect DMA. It answers what a `Dma` asks of its source and destination (engine/dma/
    engine.py `dma_read`/`dma_write`, the race hooks, the timeline, the leak report);
    `add`: writes add to what is there (a scatter-add or gather-add)."""

    __slots__ = ("base", "buffer", "rows", "add", "post", "oob", "zero_stride", "dims",
                 "out_shape", "_row_dim", "_index", "_buffer_rows", "_boxes")
    padded = False  # never past its buffer's shape

    def __init__(self, base: Region, rows: np.ndarray, add: bool = False):
        if base.post or base.oob or base.zero_stride or not base.out_shape:
            raise KernelError(f"an indirect DMA through a view of {base.buffer.name} that"
                              " pallas-check does not model (an out-of-bounds slice)")
        self.base = base
        self.buffer = base.buffer
        self.rows = np.asarray(rows, np.int64)
        self.add = add
        self.post: list[object] = []
        self.oob: list[OutOfBounds] = []
        self.zero_stride = False
        self.dims = base.dims
        self._row_dim = next(i for i, d in enumerate(base.dims) if d.__class__ is not int)
        start, _, stride = base.dims[self._row_dim]  # type: ignore[misc]  # a range
        self._buffer_rows = start + self.rows * stride
        self.out_shape = (len(self.rows), *base.out_shape[1:])
        index: list[np.ndarray | int | slice] = []
        for i, d in enumerate(base.dims):
            if i == self._row_dim:
                index.append(self._buffer_rows)
            elif d.__class__ is int:
                index.append(slice(d, d + 1))
            else:
                lo, size, step = d  # type: ignore[misc]  # a range
                index.append(slice(lo, lo + size * step, step) if size > 0 else slice(0, 0))
        self._index = tuple(index)
        self._boxes: tuple[IndexRange, ...] | None = None

    def view_dtype(self) -> np.dtype:
        return self.buffer.data.dtype

    # -- values ----------------------------------------------------------------------------
    def _to_rows(self, values: np.ndarray) -> np.ndarray:
        return np.moveaxis(values, self._row_dim, 0).reshape(self.out_shape)

    def _to_buffer(self, values: np.ndarray) -> np.ndarray:
        shape = [len(self.rows)] + [1 if d.__class__ is int else d[1]  # type: ignore[index]
                                    for i, d in enumerate(self.dims) if i != self._row_dim]
        values = np.broadcast_to(np.asarray(values), self.out_shape).reshape(shape)
        return np.moveaxis(values, 0, self._row_dim)

    def read_base(self, fill: np.ndarray | float) -> np.ndarray:
        return self._to_rows(self.buffer.data[self._index])

    read = read_base

    def written_base(self) -> np.ndarray:
        if self.buffer.fully_written:
            return np.ones(self.out_shape, bool)
        return self._to_rows(self.buffer.written[self._index])

    read_written = written_base

    def write_base(self, value: np.ndarray, written: bool | np.ndarray | None = True) -> None:
        """Store (or add) the rows; `written`: their shadow (None: left alone). An add to
        a never-written element stays never-written (its sum has no defined value)."""
        buf = self.buffer
        data = buf.writable()
        value = self._to_buffer(np.asarray(value, data.dtype))
        if self.add:
            # (numpy's stub of `at` takes no slice in an index tuple; numpy does)
            np.add.at(data, self._index, value)  # type: ignore[arg-type]
        else:
            data[self._index] = value
        if written is None or (written is True and buf.fully_written):
            return
        shadow = self._to_buffer(np.broadcast_to(np.asarray(written, bool), self.out_shape))
        if self.add:
            shadow = shadow & buf.written[self._index]
        buf.written[self._index] = shadow
        buf.recount()

    def write(self, value: np.ndarray, fill: np.ndarray | float, written: bool | np.ndarray = True,
              touched: np.ndarray | None = None) -> None:
        self.write_base(value, written)

    # -- where ----------------------------------------------------------------------------
    def _range_with_rows(self, lo: int, hi: int) -> IndexRange:
        ranges = list(self.base.index_range())
        ranges[self._row_dim] = (lo, hi)
        return tuple(ranges)

    def index_range(self) -> IndexRange:
        if not len(self.rows):
            return self._range_with_rows(0, 0)
        rows = self._buffer_rows
        return self._range_with_rows(int(rows.min()), int(rows.max()) + 1)

    def boxes(self) -> tuple[IndexRange, ...]:
        """One box per run of consecutive buffer rows (none for no rows); made once (the
        read and the write of a DMA, the race checker's and the timeline's, ask)."""
        if self._boxes is None:
            rows = sorted(set(self._buffer_rows.tolist()))
            runs: list[list[int]] = []
            for row in rows:
                if runs and runs[-1][1] == row:
                    runs[-1][1] = row + 1
                else:
                    runs.append([row, row + 1])
            self._boxes = tuple(self._range_with_rows(lo, hi) for lo, hi in runs)
        return self._boxes

    def selected_range(self, selected: np.ndarray) -> IndexRange:
        picked = np.asarray(selected, bool).reshape(len(self.rows), -1).any(axis=1)
        if not picked.any():
            return self.index_range()
        rows = self._buffer_rows[picked]
        return self._range_with_rows(int(rows.min()), int(rows.max()) + 1)


class ViewRowsRegion:
    """Some rows (the major dimension of the VIEW) of a reshaped or bitcast view, in a
    given order: the side of an indirect DMA through `ref.bitcast(...)` or
    `ref.reshape(...)` (Mosaic bitcasts or reshapes the memref, then gathers or scatters
    its rows). Where each element of those rows lies in the buffer is the view's element
    map (engine/memory/views.py), taken row by row; values move as bytes through it, so
    a row of uint32 bits gathered out of an f32 table lands bit for bit. It answers what
    a `Dma` asks of its sides, as `RowsRegion` does."""

    __slots__ = ("buffer", "rows", "add", "post", "oob", "zero_stride", "dims", "out_shape",
                 "_map", "_dtype", "_unit_bytes", "_boxes")
    padded = False  # never past its buffer's shape

    def __init__(self, base: Region, rows: np.ndarray, add: bool = False):
        if base.oob or base.zero_stride:
            raise KernelError(f"an indirect DMA through a view of {base.buffer.name} that"
                              " pallas-check does not model (an out-of-bounds slice)")
        view = base.element_map()
        if not view.units.ndim > 1:
            raise KernelError(f"an indirect DMA through a 0-d view of {base.buffer.name}")
        self.buffer = base.buffer
        self.rows = np.asarray(rows, np.int64)
        self.add = add
        self.post = base.post  # a view: never taken for a plain region (carried.py)
        self.oob: list[OutOfBounds] = []
        self.zero_stride = False
        self.dims = base.dims
        self.out_shape = (len(self.rows), *view.units.shape[1:-1])
        self._map = ElementMap(view.units[self.rows], view.per, view.shape)
        self._dtype = base.view_dtype()
        self._unit_bytes = self.buffer.data.dtype.itemsize // view.per
        self._boxes: tuple[IndexRange, ...] | None = None

    def view_dtype(self) -> np.dtype:
        return self._dtype

    # -- values: bytes through the element map -----------------------------------------
    def _units_of(self, data: np.ndarray) -> np.ndarray:
        """The buffer's bytes, one row per unit of the map (a view of `data` when it is
        C-contiguous, as buffers are)."""
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8).reshape(
            -1, self._unit_bytes)

    def read_base(self, fill: np.ndarray | float) -> np.ndarray:
        units = self._map.units
        raw = self._units_of(self.buffer.data)[units]  # (*out_shape, parts, unit bytes)
        raw = np.ascontiguousarray(raw.reshape(*units.shape[:-1], -1))
        return raw.view(self._dtype).reshape(self.out_shape)

    read = read_base

    def written_base(self) -> np.ndarray:
        if self.buffer.fully_written:
            return np.ones(self.out_shape, bool)
        elements = self._map.units // self._map.per
        written: np.ndarray = self.buffer.written.reshape(-1)[elements].all(axis=-1)
        return written

    read_written = written_base

    def write_base(self, value: np.ndarray, written: bool | np.ndarray | None = True) -> None:
        """Store (or add, in the view's element type) the rows as bytes; `written`: their
        shadow (None: left alone); an element stored in part keeps its state only where
        the part stored is initialized (`ElementMap.mark`)."""
        value = np.broadcast_to(np.asarray(value, self._dtype), self.out_shape)
        units = self._map.units
        if written is not None:
            written = np.broadcast_to(np.asarray(written, bool), self.out_shape)
        if self.add:  # each row once, every element naming it added (np.add.at)
            _, first, inverse = np.unique(self.rows, return_index=True, return_inverse=True)
            total = self.read_base(0)[first]
            np.add.at(total, inverse, value)
            if written is not None:  # a sum with a never-written term is never-written
                sums = np.ones(total.shape, bool)
                np.logical_and.at(sums, inverse, written)
                written = sums & self.written_base()[first]
            value, units = total, units[first]
        data = self.buffer.writable()
        flat = self._units_of(data)
        flat[units] = np.ascontiguousarray(value).view(np.uint8).reshape(*units.shape, -1)
        if not np.shares_memory(flat, data):
            data[...] = flat.reshape(-1).view(data.dtype).reshape(data.shape)
        if written is not None:
            ElementMap(units, self._map.per, self._map.shape).mark(self.buffer, written)

    def write(self, value: np.ndarray, fill: np.ndarray | float, written: bool | np.ndarray = True,
              touched: np.ndarray | None = None) -> None:
        self.write_base(value, written)

    # -- where ----------------------------------------------------------------------------
    def index_range(self) -> IndexRange:
        box = self._map.bbox(np.ones(self.out_shape, bool))
        return box if box is not None else tuple((0, 0) for _ in self._map.shape)

    def boxes(self) -> tuple[IndexRange, ...]:
        """Boxes holding exactly the elements of the rows, made row by row (each row's
        elements lie close together; the rows may be far apart in a large table) and
        joined where consecutive buffer rows share the same other ranges."""
        if self._boxes is None:
            units = self._map.units.reshape(len(self.rows), -1)
            found: set[IndexRange] = set()
            for first in np.unique(self.rows, return_index=True)[1]:
                elements = np.unique(units[first] // self._map.per)
                found.update(flat_boxes(elements, self._map.shape))
            self._boxes = _joined(found)
        return self._boxes

    def selected_range(self, selected: np.ndarray) -> IndexRange:
        box = self._map.bbox(np.asarray(selected, bool))
        return box if box is not None else self.index_range()


def _joined(boxes: set[IndexRange]) -> tuple[IndexRange, ...]:
    """Boxes (disjoint or equal) with those that continue each other along the first
    dimension (the same ranges in every other) joined into one."""
    out: list[list[tuple[int, int]]] = []
    for box in sorted(boxes, key=lambda b: (b[1:], b[0])):
        if out and out[-1][1:] == list(box[1:]) and out[-1][0][1] >= box[0][0]:
            out[-1][0] = (out[-1][0][0], max(out[-1][0][1], box[0][1]))
        else:
            out.append([box[0], *box[1:]])
    return tuple(tuple(b) for b in out)


def rows_region(base: Region, rows: np.ndarray, add: bool = False
                ) -> "RowsRegion | ViewRowsRegion":
    """The side of an indirect DMA that moves `rows` of `base` (its view's rows when it
    is seen through a reshape or bitcast)."""
    return ViewRowsRegion(base, rows, add) if base.post else RowsRegion(base, rows, add)


def bad_row_region(base: Region, value: int, element: int, vector: IndexVector) -> Region:
    """The row an out-of-bounds index names, as a region whose one out-of-bounds entry
    says which element of which index vector holds it (how the finding reads)."""
    dims = list(base.dims)
    what = f"{value} (element {element} of index vector {vector.name})"
    if base.post:  # a row of a view: the finding spans the view, in its dimension 0
        size = base.element_map().units.shape[0]
        return Region(base.buffer, dims, [], [OutOfBounds(0, what, size)])
    row_dim = next(i for i, d in enumerate(dims) if d.__class__ is not int)
    start, size, stride = dims[row_dim]  # type: ignore[misc]  # a range
    dims[row_dim] = start + value * stride
    return Region(base.buffer, dims, [], [OutOfBounds(row_dim, what, size)])


def vector_name(view: RefView, region: Region) -> str:
    """How a finding names an index ref: its buffer, and the slice when not all of it."""
    whole = tuple((0, n) for n in view.buffer.data.shape)
    rng = region.index_range()
    return view.buffer.name + ("" if rng == whole else format_range(rng))


def split_view(view: RefView, indexer: Any, at: int) -> RefView:
    """The plain view an indirect indexer picks rows of: the transforms before it and the
    indexer with its index vector replaced by the whole major dimension (as Mosaic splits
    it); an indexer with transforms after it is Mosaic's error."""
    if at != len(view.transforms) - 1:
        raise KernelError("the indexed ref of a gather or scatter DMA cannot have"
                          " transforms after the indexer (Mosaic: \"cannot have any"
                          " transforms following the indexer\")")
    whole = Slice(0, indexer.shape[0])
    split = NDIndexer((whole, *indexer.indices[1:]), indexer.shape, ())
    return RefView(view.buffer, view.transforms[:at] + (split,))


def active_rows(vector: IndexVector, size: int) -> tuple[np.ndarray, np.ndarray]:
    """The positions (elements) and rows of the active in-bounds indices, in order."""
    values = vector.values
    keep = vector.active & (values >= 0) & (values < size)
    return np.nonzero(keep)[0], values[keep]
