"""engine/rules/sc_lanes.py on its own: the element each lane of a SparseCore gather or
scatter touches. A lane of a plain view takes its region from the view's; the oracle is the
general way (the lane's indices as an indexer after the view's, resolved): the same
buffer index, range and shape for every lane, and a lane outside the view reported as
out of bounds (naming the lane) with no region, as before."""

from __future__ import annotations

import numpy as np

from pallas_check.engine.memory.buffer import Buffer, MemorySpace, RefView
from pallas_check.engine.memory.region import Region, resolve
from pallas_check.engine.rules.sc_lanes import Lanes, _lane_view
from pallas_check.jaxbridge.types import NDIndexer, Slice


class _Call:
    def __init__(self) -> None:
        self.out_of_bounds_seen: list[tuple[Region, str]] = []

    def out_of_bounds(self, ctx, region, operation, mask) -> None:
        self.out_of_bounds_seen.append((region, operation))


class _Ctx:
    """What Lanes asks of the running core: the fill value and where findings go."""

    def __init__(self) -> None:
        self.call = _Call()
        self.eqn = None
        self.frame_stack: list = []

    def fill(self, dtype):
        return np.array(np.nan, dtype)


def _indexer(shape, *indices) -> NDIndexer:
    return NDIndexer(indices=tuple(indices), shape=shape, int_indexer_shape=())


def test_lanes_of_a_strided_row_view_land_where_the_general_way_puts_them():
    buffer = Buffer("table_v", MemorySpace.VMEM,
                    np.arange(6 * 64, dtype=np.float32).reshape(6, 64), True)
    # table_v.at[3, pl.ds(8, 16, 2)]: 16 elements of row 3, every other one from 8
    view_transforms = [_indexer((6, 64), 3, Slice(8, 16, 2))]
    ids = np.array([0, 15, 7, 7, 3, 16, -1, 2], np.int32)
    ctx = _Ctx()
    lanes = Lanes(ctx, RefView(buffer), view_transforms, [ids], None)
    assert lanes.shape == (16,) and list(lanes.on) == [True] * 8
    for j, index in enumerate(ids):
        region = lanes.region(j, f"load_gather lane {j}")
        general = resolve(_lane_view(lanes.view, (16,), (int(index),)))
        if general.oob:
            assert region is None
            assert ctx.call.out_of_bounds_seen[-1][1] == f"load_gather lane {j}"
            assert ctx.call.out_of_bounds_seen[-1][0].oob == general.oob
            continue
        assert region is not None and region.buffer is buffer
        assert (region.dims, region.index, region.out_shape, region.index_range()) == (
            general.dims, general.index, general.out_shape, general.index_range())
        assert region.read(np.nan) == buffer.data[3, 8 + 2 * index]
    assert [op for _, op in ctx.call.out_of_bounds_seen] == ["load_gather lane 5",
                                                             "load_gather lane 6"]


def test_two_index_vectors_address_a_two_dimensional_view():
    buffer = Buffer("acc_v", MemorySpace.VMEM, np.zeros((8, 16), np.float32), True)
    rows, cols = np.array([1, 7, 0, 4]), np.array([15, 0, 3, 3])
    ctx = _Ctx()
    lanes = Lanes(ctx, RefView(buffer), [], [rows, cols], np.array([1, 0, 1, 1], bool))
    assert list(lanes.on) == [True, False, True, True]
    for j in range(4):
        region = lanes.region(j, "store_scatter")
        assert region is not None
        assert region.index == (int(rows[j]), int(cols[j]))
        assert region.index_range() == ((rows[j], rows[j] + 1), (cols[j], cols[j] + 1))
