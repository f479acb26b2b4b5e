"""The elements the lanes of a SparseCore gather or scatter address (`plsc.load_gather`,
`store_scatter`, `addupdate_scatter`; their rules are in rules/sparsecore.py): one region
per active lane, each an element read or written through rules/access.py (bounds, the
written-shadow, races), in lane order.

What a lane's region is: the lane's indices applied to the op's view, as an indexer of
ints after the view's own transforms (`_lane_view`), resolved the general way. That
resolution, per lane, once cost over a third of a gather's time (issue 54.7: 0.7-1.1 ms
per 8-lane load_gather with races on). So a lane of a plain view (no reshape or bitcast, in
bounds, no stride-0 or padded slice), whose indices fall inside the view, gets its region
from the view's own region, resolved once per op: each of the view's slices picks the
lane's index, the rest stays. That is the region the general way makes (one element, its
buffer index the same ints), so reads, writes, findings and race records are unchanged.
Any other lane (out of the view, a lane of the wrong rank, a view through transforms)
takes the general way, which reports what is wrong with it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from pallas_check.jaxbridge.types import NDIndexer, Transform
from pallas_check.engine.memory.buffer import IndexDim, RefView
from pallas_check.engine.memory.region import Region
from pallas_check.engine.rules import access, sc_values
from pallas_check.engine.seam import RunningCore


def _lane_view(view: RefView, shape: tuple[int, ...], lane_index: tuple[int, ...]) -> RefView:
    """The one element of `view` (of `shape`) a gather/scatter lane addresses."""
    indexer = NDIndexer(indices=lane_index, shape=shape, int_indexer_shape=())
    return view.with_transforms((indexer,))


class Lanes:
    """A gather's or scatter's lanes: `view` (the indexed ref), `lanes` (per lane its
    index tuple), `on` (which lanes are active), and `region(j)`, the element lane j
    touches."""

    def __init__(self, ctx: RunningCore, ref: object, transforms: Sequence[Transform] | None,
                 indices: Sequence[object], mask: object) -> None:
        self.ctx = ctx
        self.view = access.view_of(ref, transforms)
        columns = [np.asarray(i).astype(np.int64).reshape(-1) for i in indices]
        n = columns[0].shape[0]
        self.lanes: list[tuple[int, ...]] = [tuple(int(c[j]) for c in columns)
                                             for j in range(n)]
        self.on = sc_values.active(mask, n)
        base = access._resolve(ctx, self.view)
        if not base.post:
            self.shape = base.out_shape
        else:
            self.shape = tuple(base.read(ctx.fill(self.view.buffer.data.dtype)).shape)
        plain = (not base.post and not base.oob and not base.zero_stride
                 and not base.padded and base.index is not None)
        self._base: Region | None = base if plain else None
        # The view's slices: (base dimension, start, size, stride), in order.
        self._live = [(i, *d) for i, d in enumerate(base.dims)  # type: ignore[misc]
                      if d.__class__ is not int]

    def region(self, j: int, operation: str) -> Region | None:
        """The region lane j touches (None: out of bounds, reported as `operation`)."""
        lane = self.lanes[j]
        base = self._base
        if base is not None and len(lane) == len(self._live):
            dims: list[IndexDim] = list(base.dims)
            for (position, start, size, stride), index in zip(self._live, lane):
                if not 0 <= index < size:
                    break
                dims[position] = start + index * stride
            else:
                return Region.in_bounds(base.buffer, dims, tuple(dims),  # type: ignore[arg-type]
                                        ())
        ctx = self.ctx
        region = access._resolve(ctx, _lane_view(self.view, self.shape, lane), operation)
        if region.oob:  # the finding names the lane: `load_gather lane 3 of x_v[40] ...`
            ctx.call.out_of_bounds(ctx, region, operation, None)
            return None
        return region
