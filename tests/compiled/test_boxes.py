"""The compiled tier's box helpers give what XLA's dynamic slice and update give, for
every kind of start (static, traced, out of range) and box (whole array, part); the traced
index arithmetic answers what the static does."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from pallas_check.compiled.boxes import all_set, any_set, at, either, outside, plus, put, take, times

ARRAY = np.arange(6 * 8, dtype=np.float32).reshape(6, 8)


@pytest.mark.parametrize("starts, sizes", [
    ((0, 0), (6, 8)),      # the whole array
    ((2, 3), (2, 4)),      # inside
    ((5, 7), (3, 4)),      # past the end: clamped as XLA clamps
    ((-2, 1), (2, 8)),     # before the start: clamped to it, not counted from the end
])
@pytest.mark.parametrize("traced", [False, True])
def test_take_is_xla_dynamic_slice(starts, sizes, traced):
    """A box that leaves the array reads what XLA's own clamp reads, static or traced
    alike (its run is flagged out-of-bounds where the box is made)."""
    expected = np.asarray(lax.dynamic_slice(ARRAY, [jnp.int32(s) for s in starts], sizes,
                                            allow_negative_indices=False))

    def box(*at):
        return take(jnp.asarray(ARRAY), at, sizes)

    got = jax.jit(box)(*starts) if traced else box(*starts)
    np.testing.assert_array_equal(np.asarray(got), expected)


@pytest.mark.parametrize("starts, sizes", [((0, 0), (6, 8)), ((1, 2), (3, 3)),
                                           ((4, 6), (3, 3))])
def test_put_is_xla_dynamic_update_slice(starts, sizes):
    value = -np.ones(sizes, np.float32)
    expected = np.asarray(lax.dynamic_update_slice(
        ARRAY, value, [jnp.int32(s) for s in starts]))
    got = jax.jit(lambda *at: put(jnp.asarray(ARRAY), jnp.asarray(value), at))(*starts)
    np.testing.assert_array_equal(np.asarray(got), expected)


@pytest.mark.parametrize("flags", [np.ones((128, 128), bool), np.zeros((3, 0), bool),
                                   np.eye(4, dtype=bool), np.zeros((2, 128), bool)])
def test_all_set_and_any_set_are_all_and_any(flags):
    assert bool(jax.jit(all_set)(flags)) == bool(np.all(flags))
    assert bool(jax.jit(any_set)(flags)) == bool(np.any(flags))
    one_unset = np.ones((128, 128), bool)
    one_unset[127, 5] = False
    assert not bool(jax.jit(all_set)(one_unset))


@pytest.mark.parametrize("size, extent", [(1, 4), (3, 8), (8, 8)])
def test_outside_traced_is_outside_static(size, extent):
    """The traced test (lax on int32) answers what the static one does, start by start,
    past both ends."""
    starts = np.arange(-3, extent + 3, dtype=np.int32)
    traced = jax.jit(jax.vmap(lambda s: outside(s, size, extent)))(starts)
    static = [outside(int(s), size, extent) for s in starts]
    assert list(np.asarray(traced)) == static
    assert static == [bool(s < 0 or s + size > extent) for s in starts]


def test_plus_times_and_either_keep_static_values_static():
    assert plus(2, np.int32(3)) == 5 and times(4, 3) == 12
    assert either(True, False) is True
    traced = jax.jit(lambda a, b: (plus(a, 5), times(a, 3), either(a > 0, b > 0)))(
        jnp.int32(2), jnp.int32(-1))
    assert [int(traced[0]), int(traced[1]), bool(traced[2])] == [7, 6, True]
    assert traced[0].dtype == traced[1].dtype == jnp.int32


def test_at_is_the_row_a_slot_names():
    rows = np.arange(5 * 3, dtype=np.int32).reshape(5, 3)
    for slot in range(5):
        got = jax.jit(at)(jnp.asarray(rows), jnp.int32(slot))
        np.testing.assert_array_equal(np.asarray(got), rows[slot])
