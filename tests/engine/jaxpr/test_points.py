"""Index maps run by numpy over all grid points give what XLA gives, point for point."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from pallas_check.engine.jaxpr.points import NotByNumpy, numpy_index_map

MAPS = {
    "affine": lambda i, j: (i * 2 + j, jnp.int32(0)),
    "floor division and modulo": lambda i, j: ((i - 5) // 3, (j - 7) % 4),
    "division toward zero": lambda i, j: (lax.div(i - 6, 4), lax.rem(j - 9, 4)),
    "clamped": lambda i, j: (jnp.minimum(i, 3), jnp.maximum(j - 2, 0)),
    "where": lambda i, j: (jnp.where(i > j, i, j), (i == j).astype(jnp.int32)),
    "clamp": lambda i, j: (lax.clamp(1, i + j, 6), -i),
    "switch": lambda i, j: (lax.select_n((i % 3).astype(jnp.int32), i, j, i + j), j ^ 3),
    "wraps": lambda i, j: (i * jnp.int32(2**30) + j, j - jnp.int32(2**31 - 1) - 5),
}


def _points(n: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    grid = np.indices((n, m), dtype=np.int32).reshape(2, -1)
    return grid[0], grid[1]


@pytest.mark.parametrize("name", list(MAPS))
def test_numpy_gives_xlas_block_indices(name: str) -> None:
    fn = MAPS[name]
    closed = jax.make_jaxpr(fn)(jnp.int32(0), jnp.int32(0))
    run = numpy_index_map(closed, len(closed.jaxpr.outvars))
    assert run is not None, closed
    i, j = _points(8, 9)
    got = run([i, j])
    want = jax.vmap(fn)(jnp.asarray(i), jnp.asarray(j))
    for g, w in zip(got, want):
        assert g.dtype == np.asarray(w).dtype
        np.testing.assert_array_equal(g, np.asarray(w))


def test_a_division_by_zero_is_left_to_xla() -> None:
    closed = jax.make_jaxpr(lambda i, j: (lax.div(i, j),))(jnp.int32(0), jnp.int32(0))
    run = numpy_index_map(closed, 1)
    assert run is not None
    with pytest.raises(NotByNumpy):
        run(list(_points(2, 2)))


def test_a_map_of_other_arithmetic_is_left_to_xla() -> None:
    closed = jax.make_jaxpr(lambda i: (jnp.floor(i * 0.5).astype(jnp.int32),))(jnp.int32(0))
    assert numpy_index_map(closed, 1) is None


# Index maps that read scalar-prefetch operands: once discharged, a ref read is the same
# `dynamic_slice` + `squeeze` that indexing a jnp array with traced scalars gives.
TABLE = np.array([[3, -2, 7], [0, 5, -9], [11, 4, 1], [6, -1, 2]], np.int8)
TABLE_MAPS = {
    "read": lambda i, j, t: (t[i % 4, j % 3].astype(jnp.int32), i),
    "negative index wraps once": lambda i, j, t: (t[i - 4, j - 3].astype(jnp.int32), j),
    "outside is clamped": lambda i, j, t: (t[i + 2, j * 2].astype(jnp.int32),
                                           t[-7 - i, 0].astype(jnp.int32)),
    "a read inside arithmetic": lambda i, j, t: (
        jnp.where(t[i % 4, 0] > 0, i + t[0, j % 3].astype(jnp.int32), -1), jnp.int32(0)),
}


@pytest.mark.parametrize("name", list(TABLE_MAPS))
def test_numpy_reads_prefetched_arrays_as_xla_does(name: str) -> None:
    fn = TABLE_MAPS[name]
    closed = jax.make_jaxpr(fn)(jnp.int32(0), jnp.int32(0), jnp.asarray(TABLE))
    assert any(e.primitive.name == "dynamic_slice" for e in closed.jaxpr.eqns), closed
    run = numpy_index_map(closed, 2, num_grid=2)
    assert run is not None, closed
    i, j = _points(7, 5)
    got = run([i, j], [TABLE])
    want = jax.vmap(fn, in_axes=(0, 0, None))(jnp.asarray(i), jnp.asarray(j),
                                                jnp.asarray(TABLE))
    for g, w in zip(got, want):
        assert g.dtype == np.asarray(w).dtype
        np.testing.assert_array_equal(g, np.asarray(w))


def test_an_array_operand_used_otherwise_is_left_to_xla() -> None:
    """A prefetched array is read one element at a time, or the map is XLA's."""
    closed = jax.make_jaxpr(lambda i, t: (jnp.sum(t[i % 2]).astype(jnp.int32),))(
        jnp.int32(0), jnp.asarray(TABLE))
    assert numpy_index_map(closed, 1, num_grid=1) is None
