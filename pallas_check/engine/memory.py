"""Simulated TPU memory: buffers with a shadow of written elements, and ref views onto them.

A kernel's refs are `RefView`s: a buffer plus the ref transforms (indexers, bitcasts,
reshapes) applied to it. Every access resolves a view to a `Region` of the buffer, which
says which elements are touched (for bounds, the written-shadow and, later, races) and
gives a fast numpy path for the common in-bounds, plain-indexing case.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Sequence

import numpy as np
from pallas_check.jaxbridge import state_indexing
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


class Buffer:
    """One allocation: its values, which elements were ever written, and its user-facing name.

    Memory is proportional to the kernel's data, never more than needed: a buffer made
    from a read-only array (a call's operand) shares it until first written (copy on
    write), and a buffer written everywhere keeps no shadow until something marks part
    of it unwritten again.
    """

    __slots__ = ("id", "name", "space", "data", "_written", "fully_written", "owner", "key",
                 "device", "core", "_unwritten", "_borrowed", "is_output")

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
        data = np.full(tuple(shape), fill_value(dtype, fill), dtype=dtype)
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
        """The values, to write to: copied first while they are a read-only operand."""
        if self._borrowed:
            self.data = np.array(self.data)
            self._borrowed = False
        return self.data

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
        if isinstance(written, np.ndarray) and not written.all():
            self._written = written
            self.recount()
        else:
            self._written = None
            self._unwritten = 0
            self.fully_written = True

    def mark_written(self, index: Any, value: bool | np.ndarray = True) -> None:
        """Set the shadow of `index` (a basic index: ints, slices, Ellipsis); costs the size
        of the indexed part, not of the buffer (a count of unwritten elements is kept)."""
        if self._written is None:
            if value.all() if isinstance(value, np.ndarray) else bool(value):
                return  # already written everywhere
            if index is Ellipsis and not isinstance(value, np.ndarray):
                self._written = np.zeros(self.data.shape, bool)
                self.recount()
                return
            self._written = np.ones(self.data.shape, bool)
        if any(not isinstance(i, (int, np.integer, slice)) and i is not Ellipsis
               for i in (index if isinstance(index, tuple) else (index,))):
            self._written[index] = value  # advanced indexing: recount the whole buffer
            self.recount()
            return
        part = self._written[index]
        before = int(np.count_nonzero(part))
        self._written[index] = value
        after = int(np.count_nonzero(self._written[index]))
        self._unwritten -= after - before
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


@dataclasses.dataclass
class OutOfBounds:
    """An index outside a ref's dimension, found while resolving an access."""

    dim: int
    index: str
    size: int


class Region:
    """The elements of a buffer that one access touches.

    `index` is a numpy index (slices and ints) into the buffer for the plain case; `post`
    holds transforms (bitcast, reshape, gathers) that have to be applied after it.
    When some index is out of bounds, `oob` lists where and `masked` holds per-dimension
    index arrays with validity masks, so reads give the fill value there and writes drop.
    """

    __slots__ = ("buffer", "index", "post", "oob", "dims", "out_shape")

    def __init__(self, buffer: Buffer, dims: list, post: list, oob: list[OutOfBounds]):
        self.buffer = buffer
        self.dims = dims  # per base dim: int or (start, size, stride)
        self.post = post
        self.oob = oob
        # A stride of 0 (a broadcast load) has no numpy slice: such a region is read through
        # index arrays, like an out-of-bounds one.
        self.index = tuple(
            d if isinstance(d, int) else slice(d[0], d[0] + d[1] * d[2], d[2]) if d[1] > 0
            else slice(0, 0)
            for d in dims
        ) if not oob and not self.has_zero_stride_of(dims) else None
        self.out_shape = tuple(d[1] for d in dims if not isinstance(d, int))

    @staticmethod
    def has_zero_stride_of(dims: list) -> bool:
        return any(not isinstance(d, int) and d[1] > 1 and d[2] == 0 for d in dims)

    @property
    def zero_stride(self) -> bool:
        """Whether some dimension repeats one element (`pl.ds(start, n, stride=0)`)."""
        return self.has_zero_stride_of(self.dims)

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

    def selected_range(self, selected: np.ndarray) -> IndexRange:
        """Per base dimension [start, stop) of the elements `selected` (a boolean array in
        the access's own shape) picks; the whole `index_range()` when post transforms
        make the access's coordinates differ from the buffer's, or nothing is selected."""
        selected = np.asarray(selected, bool)
        if self.post or selected.shape != self.out_shape or not selected.any():
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

    def _squeeze_ints(self, arr: np.ndarray) -> np.ndarray:
        axes = tuple(i for i, d in enumerate(self.dims) if isinstance(d, int))
        return arr.reshape(tuple(s for i, s in enumerate(arr.shape) if i not in axes))

    # -- reads and writes ---------------------------------------------------------------
    def read_base(self, fill: Any) -> np.ndarray:
        """Values of the region in buffer coordinates (copy), before post transforms."""
        if self.index is not None:
            return np.array(self.buffer.data[self.index])
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

    def write_base(self, value: np.ndarray, written: bool | np.ndarray = True) -> None:
        """Store values (already in buffer coordinates); out-of-bounds elements are dropped."""
        buf = self.buffer
        data = buf.writable()
        if self.index is not None:
            data[self.index] = value
            buf.mark_written(self.index, written)
            return
        mesh, mask = self._masked_index()
        full_shape = mask.shape
        value = np.broadcast_to(np.asarray(value, dtype=data.dtype), self.out_shape)
        value = value.reshape(full_shape)
        current = data[mesh]
        data[mesh] = np.where(mask, value, current)
        cur_written = buf.written[mesh]
        new_written = np.broadcast_to(np.asarray(written), self.out_shape).reshape(full_shape)
        buf.written[mesh] = np.where(mask, new_written, cur_written)
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

    def write(self, value: np.ndarray, fill: Any) -> None:
        if not self.post:
            self.write_base(value)
            return
        # Slow path: recompute each stage, replace the innermost, then undo the chain.
        stages = [self.read_base(fill)]
        for transform in self.post:
            stages.append(_apply_post(transform, stages[-1]))
        new = np.asarray(value, dtype=stages[-1].dtype)
        new = np.broadcast_to(new, stages[-1].shape)
        for transform, before in zip(reversed(self.post), reversed(stages[:-1])):
            new = _undo_post(transform, before, new)
        self.write_base(new)


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
    buffer = view.buffer
    dims: list = [(0, n, 1) for n in buffer.shape]
    post: list = []
    oob: list[OutOfBounds] = []
    for transform in view.transforms:
        if post or not isinstance(transform, state_indexing.NDIndexer) or has_array_index(
            transform
        ):
            post.append(transform)
            continue
        live = [i for i, d in enumerate(dims) if not isinstance(d, int)]
        if len(transform.indices) != len(live):
            raise UnsupportedTransform(
                f"indexer of rank {len(transform.indices)} on a view of rank {len(live)}"
            )
        for base_dim, idx in zip(live, transform.indices):
            start0, size0, stride0 = dims[base_dim]
            if isinstance(idx, state_indexing.Slice):
                start, size, stride = _as_int(idx.start), _as_int(idx.size), int(idx.stride)
                if size > 0 and (start < 0 or start + (size - 1) * stride >= size0):
                    where = (f"{start} (stride 0, {size} times)" if stride == 0 else
                             f"{start}:{start + size * stride}"
                             + (f":{stride}" if stride != 1 else ""))
                    oob.append(OutOfBounds(base_dim, where, size0))
                dims[base_dim] = (start0 + start * stride0, size, stride0 * stride)
            else:
                i = _as_int(idx)
                if i < 0 or i >= size0:
                    oob.append(OutOfBounds(base_dim, str(i), size0))
                dims[base_dim] = start0 + i * stride0
    return Region(buffer, dims, post, oob)


def has_array_index(indexer: Any) -> bool:
    for idx in indexer.indices:
        if not isinstance(idx, state_indexing.Slice) and np.ndim(idx) > 0:
            return True
    return False
