"""engine/memory/region.py and views.py on their own: where an access lands.

A ref view resolves to a `Region` of its buffer: indexers compose (a slice of a slice is
one strided slice of the buffer), an index outside a dimension is recorded (not raised:
it is the kernel's finding) and the access reads the fill there and drops the write. A
view through a reshape or a bitcast touches exactly the buffer elements its elements are
made of (an `ElementMap`), which may not be a box of the buffer; a bitcast lays values
out as the TPU does (packing along the second-minor dimension)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from pallas_check.engine.memory.buffer import Buffer, MemorySpace, RefView
from pallas_check.engine.memory.region import OutOfBounds, index_region, resolve
from pallas_check.engine.memory.views import UnsupportedTransform, tpu_bitcast
from jax._src.state import indexing as state_indexing  # the oracle: JAX's ref types
from jax._src.state import types as state_types

NAN = np.float32(np.nan)


def numbered(shape=(16, 128), dtype=np.float32) -> Buffer:
    """A buffer written everywhere whose elements are their flat index."""
    data = np.arange(int(np.prod(shape))).reshape(shape).astype(dtype)
    return Buffer("x", MemorySpace.VMEM, data, written=True)


def unwritten(shape=(16, 128), dtype=np.float32) -> Buffer:
    return Buffer.filled("s", MemorySpace.VMEM, shape, dtype, "nan")


def at(shape, *indices):
    """An indexer as `ref.at[...]` makes it, on a view of `shape`."""
    return state_indexing.NDIndexer.from_indices_shape(tuple(indices), shape)


# -- indexers compose; bounds are recorded, not raised --------------------------------------

def test_a_slice_of_a_slice_is_one_strided_slice_of_the_buffer():
    buffer = numbered()
    region = index_region(buffer, [((4, 8, 1), (0, 128, 1)), ((2, 3, 2), 5)])
    assert region.oob == []
    assert region.index == (slice(6, 12, 2), 5)
    assert region.out_shape == (3,)
    assert region.index_range() == ((6, 11), (5, 6))
    np.testing.assert_array_equal(region.read(NAN), buffer.data[6:12:2, 5])
    every_other = index_region(buffer, [((1, 8, 2), (0, 128, 1)), ((2, 3, 1), (0, 128, 1))])
    assert every_other.index == (slice(5, 11, 2), slice(0, 128, 1))  # rows 5, 7, 9


def test_resolve_turns_a_views_indexers_into_the_same_region():
    buffer = numbered()
    view = RefView(buffer, (at((16, 128), state_indexing.Slice(4, 8),
                               state_indexing.Slice(0, 128)),
                            at((8, 128), state_indexing.Slice(2, 3, 2), 5)))
    region = resolve(view)
    assert region.post == [] and region.index == (slice(6, 12, 2), 5)


def test_an_index_past_a_dimension_is_recorded_with_where_it_lies():
    buffer = numbered((16, 128))
    assert index_region(buffer, [(16, (0, 128, 1))]).oob == [OutOfBounds(0, "16", 16)]
    assert index_region(buffer, [(-1, (0, 128, 1))]).oob == [OutOfBounds(0, "-1", 16)]
    assert index_region(buffer, [((12, 8, 1), (0, 128, 1))]).oob == [
        OutOfBounds(0, "12:20", 16)]
    assert index_region(buffer, [((0, 16, 1), (0, 65, 2))]).oob == [
        OutOfBounds(1, "0:130:2", 128)]
    assert index_region(buffer, [((3, -2, 1), (0, 128, 1))]).oob == [
        OutOfBounds(0, "3:1 (size -2)", 16)]
    assert index_region(buffer, [((16, 4, 0), (0, 128, 1))]).oob == [
        OutOfBounds(0, "16 (stride 0, 4 times)", 16)]
    assert index_region(buffer, [((16, 0, 1), (0, 128, 1))]).oob == []  # empty: nothing read


def test_an_indexer_of_the_wrong_rank_is_unsupported():
    with pytest.raises(UnsupportedTransform):
        index_region(numbered(), [((0, 16, 1),)])


def test_a_read_across_the_edge_is_the_fill_outside_and_a_write_drops_it():
    buffer = unwritten((16, 4))
    region = index_region(buffer, [((12, 8, 1), (0, 4, 1))])
    assert region.index is None  # no numpy slice: read through index arrays
    region.write(np.arange(32, dtype=np.float32).reshape(8, 4), NAN)
    np.testing.assert_array_equal(buffer.data[12:], np.arange(16).reshape(4, 4))
    assert buffer.written[12:].all() and not buffer.written[:12].any()
    values = region.read(NAN)
    np.testing.assert_array_equal(values[:4], np.arange(16).reshape(4, 4))
    assert np.isnan(values[4:]).all()
    assert region.written_base().all()  # outside counts as written: OOB is its own finding


def test_a_stride_of_zero_repeats_one_element():
    buffer = numbered((16, 128))
    region = index_region(buffer, [((3, 4, 0), (0, 128, 1))])
    assert region.zero_stride and region.oob == []
    assert region.index_range() == ((3, 4), (0, 128))
    np.testing.assert_array_equal(region.read(NAN), np.broadcast_to(buffer.data[3], (4, 128)))


def test_selected_range_is_the_bounding_box_of_the_selected_elements():
    region = index_region(numbered(), [((4, 8, 1), (0, 64, 2))])
    selected = np.zeros((8, 64), bool)
    selected[1, 3] = selected[2, 5] = True
    assert region.selected_range(selected) == ((5, 7), (6, 11))
    assert region.selected_range(np.zeros((8, 64), bool)) == region.index_range()


# -- views through reshapes and bitcasts: exactly their elements ----------------------------

def test_a_reshaped_view_touches_exactly_its_elements_even_when_they_are_no_box():
    buffer = unwritten((4, 8))
    flat = RefView(buffer, (state_types.ReshapeTransform((32,)),
                            at((32,), state_indexing.Slice(4, 8))))
    region = resolve(flat)
    assert region.post  # seen through the reshape
    np.testing.assert_array_equal(region.element_map().elements(), np.arange(4, 12))
    assert region.boxes() == (((0, 1), (4, 8)), ((1, 2), (0, 4)))
    region.write(np.ones(8, np.float32), NAN)
    assert sorted(np.flatnonzero(buffer.written)) == list(range(4, 12))
    np.testing.assert_array_equal(buffer.data.reshape(-1)[4:12], 1.0)
    flat_data = buffer.data.reshape(-1)
    assert np.isnan(flat_data[:4]).all() and np.isnan(flat_data[12:]).all()


def test_a_reshaped_views_block_is_one_box():
    buffer = numbered((16, 128))
    second = RefView(buffer, (state_types.ReshapeTransform((2, 8, 128)),
                              at((2, 8, 128), 1, state_indexing.Slice(0, 8),
                                 state_indexing.Slice(0, 128))))
    region = resolve(second)
    assert region.boxes() == (((8, 16), (0, 128)),)
    np.testing.assert_array_equal(region.read(NAN), buffer.data[8:])


def test_a_narrower_bitcast_splits_each_row_in_two_along_the_second_minor_dimension():
    """f32 (16, 128) seen as bf16 is (32, 128): rows 2r and 2r + 1 are the two halves of
    f32 row r, so two view rows make one whole buffer row and one view row half of it."""
    buffer = unwritten((16, 128))
    as_bf16 = (state_types.BitcastTransform(jnp.bfloat16),)
    both = resolve(RefView(buffer, as_bf16 + (at((32, 128), state_indexing.Slice(0, 2),
                                                state_indexing.Slice(0, 128)),)))
    assert both.boxes() == (((0, 1), (0, 128)),)
    np.testing.assert_array_equal(both.element_map().full(), np.arange(128))
    half = resolve(RefView(buffer, as_bf16 + (at((32, 128), state_indexing.Slice(2, 1),
                                                state_indexing.Slice(0, 128)),)))
    assert half.boxes() == (((1, 2), (0, 128)),)
    assert half.element_map().full().size == 0  # every element touched only in part
    half.write(np.ones((1, 128), jnp.bfloat16), NAN)
    assert not buffer.written.any()  # half an element written: the element is not
    both.write(np.ones((2, 128), jnp.bfloat16), NAN)
    assert buffer.written[0].all() and not buffer.written[1:].any()
    np.testing.assert_array_equal(both.read(NAN), np.ones((2, 128), jnp.bfloat16))


def test_a_wider_bitcast_packs_two_rows_into_one():
    buffer = unwritten((32, 128), jnp.bfloat16)
    as_f32 = (state_types.BitcastTransform(np.float32),)
    row = resolve(RefView(buffer, as_f32 + (at((16, 128), state_indexing.Slice(3, 1),
                                               state_indexing.Slice(0, 128)),)))
    assert row.boxes() == (((6, 8), (0, 128)),)
    row.write(np.full((1, 128), 2.5, np.float32), np.float32(np.nan))
    assert buffer.written[6:8].all() and buffer.written.sum() == 256
    np.testing.assert_array_equal(tpu_bitcast(buffer.data[6:8], np.dtype(np.float32)),
                                  np.full((1, 128), 2.5, np.float32))


def test_tpu_bitcast_round_trips():
    values = np.arange(16 * 128, dtype=np.float32).reshape(16, 128)
    narrow = tpu_bitcast(values, np.dtype(jnp.bfloat16))
    assert narrow.shape == (32, 128)
    np.testing.assert_array_equal(tpu_bitcast(narrow, np.dtype(np.float32)), values)
    np.testing.assert_array_equal(tpu_bitcast(values, np.dtype(np.int32)),
                                  values.view(np.int32))


# -- one region for every buffer of a shape (the access cache's shared entries) -------------

def test_a_region_of_another_buffer_of_the_same_shape_reads_and_writes_that_buffer():
    first, second = numbered(), numbered()
    second.data[...] += 1000
    region = index_region(first, [((4, 2, 1), (8, 8, 1))])
    other = region.of(second)
    assert region.of(first) is region
    assert other.buffer is second and region.buffer is first
    assert (other.dims, other.index, other.out_shape, other.boxes()) == (
        region.dims, region.index, region.out_shape, region.boxes())
    assert other.boxes() == index_region(second, [((4, 2, 1), (8, 8, 1))]).boxes()
    np.testing.assert_array_equal(other.read(NAN), second.data[4:6, 8:16])
    other.write(np.zeros((2, 8), np.float32), NAN)
    assert not second.data[4:6, 8:16].any() and first.data[4:6, 8:16].all()


def test_an_out_of_bounds_region_of_another_buffer_says_the_same():
    first, second = unwritten(), unwritten()
    region = index_region(first, [((12, 8, 1), (0, 128, 1))])  # rows 12..19 of 16
    other = region.of(second)
    assert other.oob == region.oob and other.oob[0].dim == 0
    assert other.index is None and other.buffer is second
