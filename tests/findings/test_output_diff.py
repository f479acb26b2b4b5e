"""findings/output_diff.py: an output of a call that drew from a core's PRNG
(`compare_drawn`) is compared by its shape and dtype only: the chip's bits are its own,
never ours."""

from __future__ import annotations

import numpy as np

from pallas_check.findings.output_diff import compare, compare_drawn


def test_drawn_values_are_not_compared():
    ours = np.arange(8 * 128, dtype=np.float32).reshape(8, 128) / 1024
    theirs = ours[::-1].copy()  # other bits altogether
    assert compare(ours, theirs, chip=True).mismatches == 8 * 128
    drawn = compare_drawn(ours, theirs, (1, "u_ref"))
    assert (drawn.drawn, drawn.mismatches, drawn.first, drawn.note) == (True, 0, [], None)
    assert (drawn.output, drawn.name, drawn.shape, drawn.dtype) == (1, "u_ref", (8, 128),
                                                                   "float32")


def test_a_drawn_output_of_another_shape_or_dtype_differs_whole():
    ours = np.zeros((8, 128), np.uint32)
    other_dtype = compare_drawn(ours, ours.astype(np.int32))
    assert other_dtype.mismatches == 8 * 128
    assert other_dtype.note == "the other side's shape and dtype are (8, 128) int32"
    other_shape = compare_drawn(ours, np.zeros((16, 128), np.uint32))
    assert other_shape.mismatches == 8 * 128
    assert other_shape.note == "the other side's shape and dtype are (16, 128) uint32"
