"""engine/memory/buffer.py's Buffer on its own: the written-shadow (which elements were ever
written, counted without rescanning the buffer) and copy on write of an operand's array.

A TPU's memory holds whatever was there before: an element never written reads garbage.
The simulator keeps one bool per element (the shadow) so that such a read is a finding,
and drops the shadow while every element is written, so a scratch buffer written once
costs nothing more per access. An operand's array (read-only, XLA's own) is shared until
the kernel first writes the buffer, and a value read from it never changes afterwards."""

from __future__ import annotations

import numpy as np

from pallas_check.engine.memory.buffer import Buffer, MemorySpace, fill_value
from pallas_check.engine.memory.region import Region


def scratch(shape=(8, 128), dtype=np.float32, fill="nan") -> Buffer:
    return Buffer.filled("s", MemorySpace.VMEM, shape, dtype, fill)


def whole(buffer: Buffer) -> Region:
    return Region(buffer, [(0, n, 1) for n in buffer.shape], [], [])


def test_a_new_buffer_holds_the_fill_and_nothing_is_written():
    floats, ints = scratch(), scratch(dtype=np.int32)
    assert np.isnan(floats.data).all()
    assert (ints.data == np.iinfo(np.int32).max).all()
    assert (scratch(fill="zero").data == 0).all()
    assert fill_value(np.dtype(np.bool_), "nan") == np.array(True)
    assert not floats.fully_written and not floats.written.any()
    assert floats.shadow is not None and floats.shadow.shape == (8, 128)


def test_the_shadow_counts_each_element_once():
    buffer = scratch()
    buffer.mark_written((slice(0, 4), slice(None)))
    buffer.mark_written((slice(0, 4), slice(None)))  # again: nothing new is written
    buffer.mark_written((slice(2, 6), slice(None)))  # overlapping: only rows 4, 5 are new
    assert not buffer.fully_written
    assert buffer.written[:6].all() and not buffer.written[6:].any()
    buffer.mark_written((slice(6, 8), slice(0, 127)))
    buffer.mark_written((6, 127))
    assert not buffer.fully_written  # one element left: (7, 127)
    buffer.mark_written((7, 127))
    assert buffer.fully_written
    assert buffer.shadow is None  # written everywhere: no shadow to consult


def test_a_buffer_written_everywhere_keeps_no_shadow_until_part_is_unwritten():
    buffer = Buffer("x", MemorySpace.HBM, np.zeros((4, 8), np.float32), written=True)
    assert buffer.fully_written and buffer.shadow is None
    assert buffer.written_at((slice(None), 0)) is True
    buffer.mark_written((1, slice(2, 4)), False)  # e.g. a DMA landed uninitialized data
    assert not buffer.fully_written
    expected = np.ones((4, 8), bool)
    expected[1, 2:4] = False
    np.testing.assert_array_equal(buffer.written, expected)
    buffer.mark_written((1, slice(None)))
    assert buffer.fully_written


def test_a_whole_buffer_marked_unwritten_is_all_unwritten():
    buffer = Buffer("x", MemorySpace.VMEM, np.zeros((4, 8), np.float32), written=True)
    buffer.mark_written(Ellipsis, False)
    assert not buffer.written.any() and not buffer.fully_written


def test_array_indices_and_flat_indices_mark_exactly_their_elements():
    buffer = scratch((4, 8))
    buffer.mark_written((np.array([0, 3]), np.array([1, 7])))  # elements (0, 1), (3, 7)
    assert sorted(zip(*np.nonzero(buffer.written))) == [(0, 1), (3, 7)]
    buffer.mark_flat(np.array([2, 9, 31]), True)  # C order: (0, 2), (1, 1), (3, 7)
    assert sorted(zip(*np.nonzero(buffer.written))) == [(0, 1), (0, 2), (1, 1), (3, 7)]
    buffer.mark_flat(np.arange(32), True)
    assert buffer.fully_written
    buffer.mark_flat(np.array([5]), False)
    assert not buffer.fully_written and not buffer.written[0, 5] and buffer.written.sum() == 31


def test_a_shadow_given_at_construction_is_counted():
    shadow = np.zeros((2, 4), bool)
    shadow[0] = True
    buffer = Buffer("x", MemorySpace.VMEM, np.zeros((2, 4), np.float32), written=shadow)
    assert not buffer.fully_written
    shadow[1] = True
    buffer.recount()  # the shadow was written directly
    assert buffer.fully_written


def test_an_operands_array_is_shared_until_the_first_write():
    operand = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)
    operand.flags.writeable = False  # as XLA hands an operand over
    buffer = Buffer("x", MemorySpace.HBM, operand, written=True)
    assert buffer.read_only and buffer.data is operand  # no copy on the way in
    read = whole(buffer).read_base(np.float32(np.nan))
    assert np.shares_memory(read, operand)  # a read of a never-written operand: no copy
    whole(buffer).write_base(np.zeros((8, 128), np.float32))
    assert not buffer.read_only and buffer.data is not operand
    assert (buffer.data == 0).all()
    np.testing.assert_array_equal(read, np.arange(8 * 128).reshape(8, 128))  # unchanged
    np.testing.assert_array_equal(operand, read)


def test_adopted_read_only_values_are_copied_before_a_write():
    buffer = scratch((4, 8))
    values = np.ones((4, 8), np.float32)
    values.flags.writeable = False
    buffer.adopt(values, True)
    assert buffer.fully_written and buffer.read_only and buffer.data is values
    buffer.writable()[0, 0] = 5.0
    assert values[0, 0] == 1.0 and buffer.data[0, 0] == 5.0
    partly = np.zeros((4, 8), bool)
    partly[:2] = True
    buffer.adopt(np.zeros((4, 8), np.float32), partly)  # a block half written so far
    assert not buffer.fully_written and buffer.written[:2].all() and not buffer.written[2:].any()
