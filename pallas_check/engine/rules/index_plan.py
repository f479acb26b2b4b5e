"""Ref indexing read straight from an equation's flat operands.

A `get`, `swap` or DMA equation carries its ref and the ref's indexers as a pytree of JAX
objects (TransformedRef, NDIndexer, Slice) flattened into its operands. Rebuilding those
objects at every access (JAX's unflatten, then reading each index back out of them) cost
more than the access itself in DMA-bound kernels: a paged attention starts a DMA per
page, each with a new page index. A plan, made once per pytree structure, records where
each index sits among the flat operands (or its static value), so an access reads its
ints from there and goes straight to `index_region`.

Only the usual spelling is planned: indexers of scalars and static-size slices on a ref
that carries no transforms of its own. Anything else (bitcasts, reshapes, index arrays,
dynamic sizes) answers None, and the caller takes the general path (`resolve`),
which stays the reference for what a region is.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Callable, Sequence, cast

from jax.tree_util import PyTreeDef


from pallas_check.jaxbridge.types import NDIndexer, Slice, TransformedRef
from pallas_check.engine.memory.access_cache import scalar_index
from pallas_check.engine.memory.buffer import Buffer, RefView
from pallas_check.engine.memory.region import Region, index_region
from pallas_check.engine.runtime import caches


class _Slot:
    """A placeholder for the flat operand at `position` while a plan is made."""

    __slots__ = ("position",)

    def __init__(self, position: int) -> None:
        self.position = position


# One dimension of an indexer: (position, static value, size, stride); position -1 means
# the start (or the int) is static; size None means an int index, not a slice.
_Dim = tuple[int, int, "int | None", int]

# A numpy index of an access in bounds: an int or a slice per dimension.
NumpyIndex = tuple[int | slice, ...]

# Where one pytree argument's leaves sit in an equation's flat operands (from, to), its own
# structure and its plan (`plan_for`'s): a DMA's arguments (rules/dma.py's layout).
ArgLayout = tuple[int, int, PyTreeDef, "IndexPlan | None"]


@dataclasses.dataclass(frozen=True)
class IndexPlan:
    """Where a ref (if the pytree holds one) and its indices sit in the flat operands."""

    ref: int | None
    steps: tuple[tuple[_Dim, ...], ...]
    # The in-bounds case as straight-line code (`_in_bounds_fns`), made with the plan: the
    # numpy index alone (`index_in_bounds`), and the region.
    index_in_bounds: Callable[[Sequence[object], Buffer], NumpyIndex | None] = (
        dataclasses.field(init=False, repr=False, compare=False))
    _in_bounds: Callable[[Sequence[object], Buffer], Region | None] = dataclasses.field(
        init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        index_fn, region_fn = _in_bounds_fns(self.steps)
        object.__setattr__(self, "index_in_bounds", index_fn)
        object.__setattr__(self, "_in_bounds", region_fn)

    def region(self, leaves: Sequence[object], ref: object) -> Region | None:
        """The region `ref` indexed by the leaves touches, or None when this access is not
        in the planned spelling (the caller resolves it the general way). `ref`: the
        pytree's own (`leaves[self.ref]`), the ref of a get or swap (whose pytree holds
        only transforms), or a remote DMA destination's counterpart on its device."""
        if ref.__class__ is not RefView or ref.transforms:
            return None
        region = self._in_bounds(leaves, ref.buffer)
        if region is not None:
            return region
        steps = []  # out of bounds, a stride of 0, ranks that differ: the full account
        for indexer in self.steps:
            dims: list[int | tuple[int, int, int]] = []
            for position, static, size, stride in indexer:
                value = static if position < 0 else scalar_index(leaves[position])
                if value is None:
                    return None
                dims.append(value if size is None else (value, size, stride))
            steps.append(dims)
        return index_region(ref.buffer, steps)


@functools.lru_cache(maxsize=4096)
def _in_bounds_fns(steps: tuple[tuple[_Dim, ...], ...]
                   ) -> tuple[Callable[[Sequence[object], Buffer], NumpyIndex | None],
                              Callable[[Sequence[object], Buffer], Region | None]]:
    """`index(leaves, buffer)` and `region(leaves, buffer)`: the numpy index and the
    region of an access in bounds, with no empty or stride-0 slice, on a buffer of the
    rank the plan expects, as `index_region` would make them; None for anything
    else (the caller then takes the general account, which says what is wrong).
    Generated per plan: a DMA-bound kernel resolves a fresh source page at every DMA, and
    walking the plan's tuples cost more than the copy's bookkeeping around it. Made once
    per `steps` for the process (they are all the code depends on): each call of a
    kernel is traced anew, with new pytrees and so new plans, and compiling the same
    source again cost a SparseCore kernel of a few hundred distinct accesses about a
    quarter of a second per call (issue 54.7)."""
    if not steps:
        return _whole_index, _whole
    rank = len(steps[0])
    lines = ["    shape = buffer.data.shape", f"    if len(shape) != {rank}: return None"]
    if rank:
        lines.append(f"    {', '.join(f'n{b}' for b in range(rank))}{',' if rank == 1 else ''}"
                     " = shape")
    # Per base dimension: ("int", expr, "", 0) or ("slice", start expr, size expr, static
    # stride).
    dims: list[tuple[str, str, str, int]] = [("slice", "0", f"n{b}", 1) for b in range(rank)]
    live = list(range(rank))
    names = itertools.count()
    for step in steps:
        if len(step) != len(live):
            return _never, _never  # the general path explains the ranks
        still = []
        for base, (position, static, size, stride) in zip(live, step):
            _, start0, size0, stride0 = dims[base]
            if position < 0:
                value = str(static)
            else:
                value = f"x{next(names)}"
                lines += [f"    {value} = scalar_index(leaves[{position}])",
                          f"    if {value} is None: return None"]
            start = value if start0 == "0" and stride0 == 1 else f"({start0} + {value} * {stride0})"
            if size is None:
                lines.append(f"    if not 0 <= {value} < {size0}: return None")
                dims[base] = ("int", start, "", 0)
                continue
            if stride == 0 or size == 0:
                return _never, _never  # rare: the general path's business
            lines.append(f"    if {value} < 0 or {value} + {(size - 1) * stride} >= {size0}:"
                         " return None")
            name = f"s{next(names)}"
            lines.append(f"    {name} = {start}")
            dims[base] = ("slice", name, str(size), stride0 * stride)
            still.append(base)
        live = still
    index, region_dims, out_shape = [], [], []
    for dim in dims:
        if dim[0] == "int":
            index.append(dim[1])
            region_dims.append(dim[1])
            continue
        _, start, extent, step_stride = dim
        index.append(f"slice({start}, {start} + {extent} * {step_stride}, {step_stride})")
        region_dims.append(f"({start}, {extent}, {step_stride})")
        out_shape.append(extent)
    index_tuple = "".join(i + ", " for i in index)
    shape_tuple = "".join(n + ", " for n in out_shape)
    body = "\n".join(lines)
    source = (f"def index(leaves, buffer):\n{body}\n    return ({index_tuple})\n"
              f"def region(leaves, buffer):\n{body}\n"
              f"    return Region.in_bounds(buffer, [{', '.join(region_dims)}],"
              f" ({index_tuple}), ({shape_tuple}))\n")
    # (the generated functions' names, then theirs; `exec` types a namespace's values Any)
    namespace: dict[str, object] = {"scalar_index": scalar_index, "Region": Region}
    exec(compile(source, "<pallas-check index plan>", "exec"), namespace)  # noqa: S102
    return (cast(Callable[[Sequence[object], Buffer], NumpyIndex | None], namespace["index"]),
            cast(Callable[[Sequence[object], Buffer], Region | None], namespace["region"]))


def _never(leaves: Sequence[object], buffer: Buffer) -> None:
    return None


def _whole_index(leaves: Sequence[object], buffer: Buffer) -> NumpyIndex | None:
    """The numpy index of a bare ref: all of its buffer (None for an empty one)."""
    shape = buffer.data.shape
    if 0 in shape:
        return None
    return tuple([slice(0, n, 1) for n in shape])


def _whole(leaves: Sequence[object], buffer: Buffer) -> Region | None:
    """The region of a bare ref: all of its buffer (None for an empty one)."""
    index = _whole_index(leaves, buffer)
    if index is None:
        return None
    shape = buffer.data.shape
    return Region.in_bounds(buffer, [(0, n, 1) for n in shape], index, shape)


@caches.by_identity
def has_dynamic_size(tree: PyTreeDef) -> bool:
    """Whether a ref-and-indexers pytree slices some dimension with a traced size
    (`pl.ds(start, n)` with `n` computed by the kernel): the size is then one of its
    leaves, so what it addresses (and how many bytes a DMA of it moves) changes with the
    leaves, not only with the pytree's structure."""
    try:
        shaped = tree.unflatten([_Slot(k) for k in range(tree.num_leaves)])
    except Exception:  # a pytree node that checks its leaves: look at nothing
        return False
    if isinstance(shaped, TransformedRef):
        transforms = tuple(shaped.transforms)
    elif isinstance(shaped, (tuple, list)):
        transforms = tuple(shaped)
    else:
        return False
    return any(isinstance(idx, Slice) and isinstance(idx.size, _Slot)
               for transform in transforms if isinstance(transform, NDIndexer)
               for idx in transform.indices)


@caches.by_identity
def plan_for(tree: PyTreeDef) -> IndexPlan | None:
    """The plan of a ref-and-indexers pytree (a TransformedRef, a bare ref, or a tuple of
    transforms), or None when it is not in the planned spelling."""
    try:
        shaped = tree.unflatten([_Slot(k) for k in range(tree.num_leaves)])
    except Exception:  # a pytree node that checks its leaves: not ours to plan
        return None
    ref: int | None = None
    if isinstance(shaped, TransformedRef):
        if not isinstance(shaped.ref, _Slot):
            return None
        ref, transforms = shaped.ref.position, tuple(shaped.transforms)
    elif isinstance(shaped, _Slot):
        ref, transforms = shaped.position, ()
    elif isinstance(shaped, (tuple, list)):
        transforms = tuple(shaped)
    else:
        return None
    steps = []
    for transform in transforms:
        if not isinstance(transform, NDIndexer):
            return None
        if any(not isinstance(n, int) for n in transform.int_indexer_shape):
            return None
        dims: list[_Dim] = []
        for idx in transform.indices:
            if isinstance(idx, Slice):
                size = scalar_index(idx.size)
                if size is None:
                    return None  # a dynamic size
                start = idx.start
                if isinstance(start, _Slot):
                    dims.append((start.position, 0, size, int(idx.stride)))
                elif (static := scalar_index(start)) is not None:
                    dims.append((-1, static, size, int(idx.stride)))
                else:
                    return None
            elif isinstance(idx, _Slot):
                dims.append((idx.position, 0, None, 1))
            else:
                return None
        steps.append(tuple(dims))
    return IndexPlan(ref, tuple(steps))
