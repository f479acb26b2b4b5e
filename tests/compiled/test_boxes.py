"""The compiled tier's box helpers give what XLA's dynamic slice and update give, for
every kind of start (static, traced, out of range) and box (whole array, part)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from pallas_check.compiled.boxes import all_set, any_set, put, take

ARRAY = np.arange(6 * 8, dtype=np.float32).reshape(6, 8)


@pytest.mark.parametrize("starts, sizes", [
    ((0, 0), (6, 8)),      # the whole array
    ((2, 3), (2, 4)),      # inside
    ((5, 7), (3, 4)),      # past the end: clamped as XLA clamps
    ((-2, 1), (2, 8)),     # before the start: clamped
])
@pytest.mark.parametrize("traced", [False, True])
def test_take_is_xla_dynamic_slice(starts, sizes, traced):
    expected = np.asarray(lax.dynamic_slice(ARRAY, [jnp.int32(s) for s in starts], sizes))

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
