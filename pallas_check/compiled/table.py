"""The DMAs a compiled call has in flight, as arrays XLA carries: the table, its rows' sites.

A DMA start is traced once per site (`DmaSite`: its buffers and static box sizes); the
table holds per slot the site, the boxes' starts and sizes, the semaphore cell and bytes,
whether it has landed, and an age (newest first is the order on_wait lands and retires).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax

from pallas_check.compiled.boxes import MAX_RANK, at, i32

# DMAs in flight at once; one more sets TABLE_FULL (the engine then runs the call).
TABLE_SIZE = 32


@dataclasses.dataclass(frozen=True)
class DmaSite:
    """A DMA start as traced: its buffers and box sizes are static, its starts are not."""

    src: int
    dst: int
    src_serial: int  # the allocations the site's buffers were when it was traced
    dst_serial: int
    src_sizes: tuple[int, ...]
    dst_sizes: tuple[int, ...]
    nbytes: int
    sem: int  # the semaphore array it signals (a wait on it can land only its sites)


# The DMA table's columns: one int32 row per slot (one scatter writes a started DMA).
_COLUMNS = {"active": 0, "landed": 1, "site": 2, "age": 3, "sem": 4, "bytes": 5,
            "src_buf": 6, "dst_buf": 7}
_BOXES = {"src_start": 8, "src_size": 8 + MAX_RANK, "dst_start": 8 + 2 * MAX_RANK,
          "dst_size": 8 + 3 * MAX_RANK}
_WIDTH = 8 + 4 * MAX_RANK


@jax.tree_util.register_pytree_node_class
class Table:
    """The DMAs in flight: a row per slot (`_COLUMNS`, `_BOXES`) and the clock that ages
    them; read by column name."""

    def __init__(self, rows: jax.Array, clock: jax.Array) -> None:
        self.rows, self.clock = rows, clock

    @classmethod
    def empty(cls) -> Table:
        rows = jnp.zeros((TABLE_SIZE, _WIDTH), jnp.int32)
        rows = rows.at[:, _COLUMNS["src_buf"]].set(-1).at[:, _COLUMNS["dst_buf"]].set(-1)
        return cls(rows, jnp.zeros((), jnp.int32))

    def tree_flatten(self) -> tuple[tuple[jax.Array, jax.Array], None]:
        return (self.rows, self.clock), None

    @classmethod
    def tree_unflatten(cls, aux: None, children: tuple[jax.Array, jax.Array]) -> Table:
        return cls(*children)

    def __getitem__(self, name: str) -> jax.Array:
        if name in _COLUMNS:
            column = lax.index_in_dim(self.rows, _COLUMNS[name], axis=1, keepdims=False)
            return lax.ne(column, np.int32(0)) if name in ("active", "landed") else column
        start = _BOXES[name]
        return lax.slice_in_dim(self.rows, start, start + MAX_RANK, axis=1)

    def at(self, slot: jax.Array, name: str) -> jax.Array:
        """The column's value in `slot` (a row of starts or sizes for a box column)."""
        return at(self[name], slot)

    # Writes select over the whole (small) table rather than scatter into it: an
    # elementwise select is one fused loop that leaves the old table readable, where a
    # scatter updates in place and XLA copies the table first whenever the old one is
    # still read (a row's column read, then the row updated: most writes here).

    def set(self, slot: jax.Array, name: str, value: Any) -> Table:
        return self.set_where(slot, name, value, True)

    def set_where(self, slot: jax.Array, name: str, value: Any, when: Any) -> Table:
        """`set`, where `when` holds (the slot's column as it was elsewhere)."""
        here = _cell_mask(slot, _COLUMNS[name])
        if when is not True:
            here = here & when
        return Table(jnp.where(here, jnp.asarray(value, jnp.int32), self.rows), self.clock)

    def newest(self, among: jax.Array) -> jax.Array:
        """The slot of the newest DMA among the rows `among` selects."""
        return jnp.argmax(jnp.where(among, self["age"], -1))

    def started(self, slot: jax.Array, row: Sequence[Any]) -> Table:
        """A DMA in `slot` (its row: a value per column, ints where known), one tick
        older than the last. The row is a constant with the traced values selected in
        by column, which XLA fuses into the one select that writes it (a concatenate
        of the values was an operation of its own at every DMA start)."""
        known = np.array([int(v) if isinstance(v, (int, np.integer)) else 0 for v in row],
                         np.int32)
        value: jax.Array = jnp.asarray(known)[None, :]
        columns = lax.broadcasted_iota(jnp.int32, (1, _WIDTH), 1)
        for k, v in enumerate(row):
            if not isinstance(v, (int, np.integer)):
                value = lax.select(lax.eq(columns, lax.full((1, _WIDTH), np.int32(k))),
                                   lax.full((1, _WIDTH), i32(v)), value)
        here = lax.eq(lax.broadcasted_iota(jnp.int32, (TABLE_SIZE, 1), 0),
                      lax.full((TABLE_SIZE, 1), i32(slot)))
        shape = (TABLE_SIZE, _WIDTH)
        rows = lax.select(lax.broadcast_in_dim(here, shape, (0, 1)),
                          lax.broadcast_in_dim(value, shape, (0, 1)), self.rows)
        return Table(rows, lax.add(self.clock, np.int32(1)))


def _cell_mask(slot: jax.Array, column: int) -> jax.Array:
    rows = lax.broadcasted_iota(jnp.int32, (TABLE_SIZE, _WIDTH), 0)
    columns = lax.broadcasted_iota(jnp.int32, (TABLE_SIZE, _WIDTH), 1)
    return (rows == slot) & (columns == column)
