"""Ref indexing read straight from an equation's flat operands.

A `get`, `swap` or DMA equation carries its ref and the ref's indexers as a pytree of JAX
objects (TransformedRef, NDIndexer, Slice) flattened into its operands. Rebuilding those
objects at every access (JAX's unflatten, then reading each index back out of them) cost
more than the access itself in DMA-bound kernels: a paged attention starts a DMA per
page, each with a new page index. A plan, made once per pytree structure, records where
each index sits among the flat operands (or its static value), so an access reads its
ints from there and goes straight to `memory.index_region`.

Only the usual spelling is planned: indexers of scalars and static-size slices on a ref
that carries no transforms of its own. Anything else (bitcasts, reshapes, index arrays,
dynamic sizes) answers None, and the caller takes the general path (`memory.resolve`),
which stays the reference for what a region is.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from pallas_check.jaxbridge import state_indexing
from pallas_check.jaxbridge import state_types

from pallas_check.engine import lru, memory
from pallas_check.engine.memory import RefView, Region


class _Slot:
    """A placeholder for the flat operand at `position` while a plan is made."""

    __slots__ = ("position",)

    def __init__(self, position: int) -> None:
        self.position = position


# One dimension of an indexer: (position, static value, size, stride); position -1 means
# the start (or the int) is static; size None means an int index, not a slice.
_Dim = tuple[int, int, "int | None", int]


@dataclasses.dataclass(frozen=True)
class IndexPlan:
    """Where a ref (if the pytree holds one) and its indices sit in the flat operands."""

    ref: int | None
    steps: tuple[tuple[_Dim, ...], ...]

    def region(self, leaves: Sequence[Any], ref: Any) -> Region | None:
        """The region `ref` indexed by the leaves touches, or None when this access is not
        in the planned spelling (the caller resolves it the general way). `ref`: the
        pytree's own (`leaves[self.ref]`), the ref of a get or swap (whose pytree holds
        only transforms), or a remote DMA destination's counterpart on its device."""
        if ref.__class__ is not RefView or ref.transforms:
            return None
        steps = []
        for indexer in self.steps:
            dims: list = []
            for position, static, size, stride in indexer:
                value = static if position < 0 else memory.scalar_index(leaves[position])
                if value is None:
                    return None
                dims.append(value if size is None else (value, size, stride))
            steps.append(dims)
        return memory.index_region(ref.buffer, steps)


@lru.by_identity
def plan_for(tree: Any) -> IndexPlan | None:
    """The plan of a ref-and-indexers pytree (a TransformedRef, a bare ref, or a tuple of
    transforms), or None when it is not in the planned spelling."""
    try:
        shaped = tree.unflatten([_Slot(k) for k in range(tree.num_leaves)])
    except Exception:  # a pytree node that checks its leaves: not ours to plan
        return None
    ref: int | None = None
    if isinstance(shaped, state_types.TransformedRef):
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
        if not isinstance(transform, state_indexing.NDIndexer):
            return None
        if any(not isinstance(n, int) for n in transform.int_indexer_shape):
            return None
        dims: list[_Dim] = []
        for idx in transform.indices:
            if isinstance(idx, state_indexing.Slice):
                size = memory.scalar_index(idx.size)
                if size is None:
                    return None  # a dynamic size
                start = idx.start
                if isinstance(start, _Slot):
                    dims.append((start.position, 0, size, int(idx.stride)))
                elif (static := memory.scalar_index(start)) is not None:
                    dims.append((-1, static, size, int(idx.stride)))
                else:
                    return None
            elif isinstance(idx, _Slot):
                dims.append((idx.position, 0, None, 1))
            else:
                return None
        steps.append(tuple(dims))
    return IndexPlan(ref, tuple(steps))
