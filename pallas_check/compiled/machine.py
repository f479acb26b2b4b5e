"""The state a compiled call carries through its computation, and what acts on it.

Everything the engine keeps as Python objects is here an array that XLA carries through
the grid loop and every loop of the kernel: each buffer's value and, where something can
leave it unwritten, its written-shadow (a bool per element); the semaphores as one int32
vector of counts; the DMAs in flight as a fixed-size table; and the verdict bits.

A `Machine` is the state at one point of tracing. Control flow hands its arrays over as a
pytree (`carry`) and takes them back (`restore`), so a `lax.while_loop` or `lax.switch`
carries the whole memory the way the engine's Python carries it. Buffers are numbered as
they are made (the call's operands and scratch, then each `pl.run_scoped` allocation while
its scope lasts), the same way in every tracing pass.

The DMA table holds, per slot, the DMA's site (its start equation with its static sizes:
`DmaSite`), its source and destination boxes, its semaphore cell and bytes, whether it has
landed, and an age. `on_wait`: a wait lands the DMAs on its semaphore newest first until
the count covers it, as the engine does (engine/dma/policy.py); `eager`: a start lands at
once. A wait then retires the landed DMAs its bytes cover, newest first; what is left in
the table at the end was never waited.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax

from pallas_check.compiled.boxes import (MAX_RANK, Index, any_of, i32, meets, outside, padded,
                                         plus, times)
from pallas_check.compiled.verdict import Verdict
from pallas_check.engine.memory.buffer import fill_value

# DMAs in flight at once; one more sets TABLE_FULL (the engine then runs the call).
TABLE_SIZE = 32

# The machine's state as a pytree (`Machine.carry`): buffers, shadows, counts, table, verdict.
Carry = tuple[Any, ...]


class Unsupported(Exception):
    """The call needs the engine; the message is the reason, a short phrase."""


@dataclasses.dataclass(frozen=True)
class BufferInfo:
    """One buffer of the call: the kernel's view of an operand, a block, scratch."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    tracked: bool  # has a written-shadow (else every element counts as written)
    scratch: bool  # the kernel's own allocation: left partly untouched is UNTOUCHED
    serial: int = -1  # the allocation's number in the trace (a freed id is used again)


@dataclasses.dataclass(frozen=True)
class SemInfo:
    """A semaphore array: its cells are `base` onward in the machine's count vector."""

    name: str
    base: int
    shape: tuple[int, ...]
    counts_bytes: bool  # a DMA semaphore (a regular one counts signals)


class Ref:
    """A kernel ref while tracing: a buffer (or semaphore array) and the box of it the
    ref's indexing selects: per buffer dimension a start, a static size, and whether the
    dimension is still a dimension of the view (an integer index drops it)."""

    __slots__ = ("buffer", "sem", "starts", "sizes", "kept")

    def __init__(self, buffer: int, sem: bool, starts: tuple[Index, ...],
                 sizes: tuple[int, ...], kept: tuple[bool, ...]) -> None:
        self.buffer, self.sem = buffer, sem
        self.starts, self.sizes, self.kept = starts, sizes, kept

    @classmethod
    def whole(cls, buffer: int, shape: tuple[int, ...], sem: bool = False) -> Ref:
        return cls(buffer, sem, (0,) * len(shape), tuple(shape), (True,) * len(shape))

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(s for s, k in zip(self.sizes, self.kept) if k)

    def indexed(self, indexer: Any) -> Ref:
        """The ref after one NDIndexer: a `pl.ds` of static size and stride 1, or an
        integer, per dimension of the view (anything else needs the engine)."""
        if tuple(getattr(indexer, "int_indexer_shape", ()) or ()):
            raise Unsupported("an index array")
        starts, sizes, kept = list(self.starts), list(self.sizes), list(self.kept)
        dims = [d for d, k in enumerate(self.kept) if k]
        if len(indexer.indices) != len(dims):
            raise Unsupported("an indexer of another rank")
        for d, index in zip(dims, indexer.indices):
            if hasattr(index, "size") and hasattr(index, "stride"):  # a Slice
                if not isinstance(index.size, (int, np.integer)) or index.stride != 1:
                    raise Unsupported("a slice of traced size or with a stride")
                starts[d] = plus(starts[d], index.start)
                sizes[d] = int(index.size)
            else:
                if np.ndim(index) != 0:
                    raise Unsupported("an index array")
                starts[d] = plus(starts[d], index)
                sizes[d], kept[d] = 1, False
        return Ref(self.buffer, self.sem, tuple(starts), tuple(sizes), tuple(kept))


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


@dataclasses.dataclass
class Layout:
    """What both tracing passes share: the options, and the DMA sites the first pass met
    (the second builds each landing as a switch over all of them)."""

    races: bool
    eager: bool
    fill: str
    sites: list[DmaSite] = dataclasses.field(default_factory=list)
    site_ids: dict[tuple[object, ...], int] = dataclasses.field(default_factory=dict)
    frozen: bool = False
    # Whether a landing was traced before every site was known (the trace is then traced
    # again, with all of them: `program.build`).
    landed: bool = False
    stale: bool = False

    def site(self, key: tuple[object, ...], make: DmaSite) -> int:
        found = self.site_ids.get(key)
        if found is None:
            if self.frozen:
                raise Unsupported("a DMA the first tracing pass did not meet")
            found = self.site_ids[key] = len(self.sites)
            self.sites.append(make)
            self.stale = self.stale or self.landed
        return found


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
            column = self.rows[:, _COLUMNS[name]]
            return column.astype(bool) if name in ("active", "landed") else column
        at = _BOXES[name]
        return self.rows[:, at:at + MAX_RANK]

    def set(self, slot: jax.Array, name: str, value: Any) -> Table:
        return Table(self.rows.at[slot, _COLUMNS[name]].set(jnp.asarray(value, jnp.int32)),
                     self.clock)

    def started(self, slot: jax.Array, row: jax.Array) -> Table:
        """A DMA in `slot` (its row), one tick older than the last."""
        return Table(self.rows.at[slot].set(row), self.clock + 1)


class Machine:
    """The call's state at one point of tracing (see the module docstring)."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.buffers: list[BufferInfo] = []
        self.values: list[jax.Array] = []
        self.shadows: list[jax.Array | None] = []
        self.semaphores: list[SemInfo] = []
        self.counts = jnp.zeros((0,), jnp.int32)
        self.table = Table.empty()
        self.verdict = jnp.zeros((), jnp.int32)
        # Races on, what the race check covered: the accesses checked against the DMAs in
        # flight, and the most DMAs in flight at once (the JSON report's `races`).
        self.coverage = jnp.zeros((2,), jnp.int32)
        self.allocations = 0

    # -- the state as a pytree ---------------------------------------------------------

    def carry(self, buffers: Sequence[int] | None = None) -> Carry:
        """The state as a pytree: every buffer, or only `buffers` (what a loop or branch
        may write; the others it reads as they are, closed over)."""
        ids = range(len(self.values)) if buffers is None else buffers
        return (tuple(self.values[b] for b in ids), tuple(self.shadows[b] for b in ids),
                self.counts, self.table, self.verdict, self.coverage)

    def restore(self, carry: Carry, buffers: Sequence[int] | None = None) -> None:
        values, shadows, self.counts, self.table, self.verdict, self.coverage = carry
        if buffers is None:
            self.values, self.shadows = list(values), list(shadows)
            return
        for b, value, shadow in zip(buffers, values, shadows):
            self.values[b], self.shadows[b] = value, shadow

    def snapshot(self) -> tuple[list[jax.Array], list[jax.Array | None]]:
        return list(self.values), list(self.shadows)

    def reset(self, snapshot: tuple[list[jax.Array], list[jax.Array | None]]) -> None:
        """Back to the buffers of `snapshot` (what a traced loop body left in the
        buffers it does not carry belongs to that trace)."""
        self.values, self.shadows = list(snapshot[0]), list(snapshot[1])

    def live(self, site: DmaSite) -> bool:
        """Whether the site's buffers are the allocations it was traced with (a site in
        a scope that has ended moves nothing)."""
        n = len(self.buffers)
        return (site.src < n and site.dst < n
                and self.buffers[site.src].serial == site.src_serial
                and self.buffers[site.dst].serial == site.dst_serial)

    def landing_targets(self) -> set[int]:
        """The buffers a wait may land a DMA in (on_wait: any started DMA's)."""
        if self.layout.eager:
            return set()
        self.layout.landed = True
        return {site.dst for site in self.layout.sites if self.live(site)}

    def flag(self, condition: Any, bit: Verdict) -> None:
        """Set `bit` where `condition` (a traced or static bool) holds."""
        if isinstance(condition, (bool, np.bool_)):
            if condition:
                self.verdict = self.verdict | int(bit)
            return
        self.verdict = self.verdict | jnp.where(condition, jnp.int32(int(bit)), 0)

    # -- buffers and semaphores --------------------------------------------------------

    def add_buffer(self, info: BufferInfo, value: jax.Array | None = None,
                   written: bool = False) -> int:
        """A new buffer (`value`, or the never-written fill), numbered in order."""
        if len(info.shape) > MAX_RANK:
            raise Unsupported(f"a buffer of rank {len(info.shape)}")
        if value is None:
            value = jnp.full(info.shape, fill_value(info.dtype, self.layout.fill), info.dtype)
        info = dataclasses.replace(info, serial=self.allocations)
        self.allocations += 1
        self.buffers.append(info)
        self.values.append(value)
        self.shadows.append(jnp.full(info.shape, written) if info.tracked else None)
        return len(self.buffers) - 1

    def add_semaphores(self, name: str, shape: tuple[int, ...], counts_bytes: bool) -> int:
        base = int(self.counts.shape[0])
        self.semaphores.append(SemInfo(name, base, tuple(shape), counts_bytes))
        self.counts = jnp.concatenate([self.counts, jnp.zeros(math.prod(shape), jnp.int32)])
        return len(self.semaphores) - 1

    def free(self, buffers: int, semaphores: int) -> None:
        """The end of a scope: its allocations, the last made, are checked and dropped."""
        for _ in range(buffers):
            info, shadow = self.buffers.pop(), self.shadows.pop()
            self.values.pop()
            if info.scratch and shadow is not None:
                self.flag(~jnp.all(shadow), Verdict.UNTOUCHED)
        alive = len(self.buffers)  # a DMA in flight to or from a buffer gone: never waited
        t = self.table
        self.flag(jnp.any(t["active"] & ((t["src_buf"] >= alive) | (t["dst_buf"] >= alive))),
                  Verdict.DMA_NOT_WAITED)
        for _ in range(semaphores):
            sem = self.semaphores.pop()
            self.flag(jnp.any(self.counts[sem.base:] != 0), Verdict.SEMAPHORE_LEFT)
            self.counts = self.counts[:sem.base]

    def cell(self, ref: Ref) -> jax.Array:
        """The count index of the one semaphore `ref` selects."""
        if not ref.sem:
            raise Unsupported("a semaphore operation on a buffer")
        if any(ref.kept) and math.prod(ref.sizes) != 1:
            raise Unsupported("a semaphore array used whole")
        sem = self.semaphores[ref.buffer]
        flat: Index = sem.base
        stride = 1
        for start, size in reversed(list(zip(ref.starts, sem.shape))):
            self.flag(outside(start, 1, size), Verdict.OUT_OF_BOUNDS)
            flat = plus(flat, times(start, stride))
            stride *= size
        return jnp.clip(i32(flat), sem.base, sem.base + max(math.prod(sem.shape), 1) - 1)

    # -- kernel accesses ----------------------------------------------------------------

    def read(self, ref: Ref, check_written: bool = True) -> jax.Array:
        b = self._checked(ref, write=False)
        starts = [i32(s) for s in ref.starts]
        value = lax.dynamic_slice(self.values[b], starts, ref.sizes)
        shadow = self.shadows[b]
        if check_written and shadow is not None:
            self.flag(~jnp.all(lax.dynamic_slice(shadow, starts, ref.sizes)),
                      Verdict.UNINITIALIZED)
        return value.reshape(ref.shape)

    def write(self, ref: Ref, value: jax.Array) -> None:
        b = self._checked(ref, write=True)
        starts = [i32(s) for s in ref.starts]
        info = self.buffers[b]
        value = jnp.asarray(value).astype(info.dtype).reshape(ref.sizes)
        self.values[b] = lax.dynamic_update_slice(self.values[b], value, starts)
        shadow = self.shadows[b]
        if shadow is not None:
            self.shadows[b] = lax.dynamic_update_slice(
                shadow, jnp.ones(ref.sizes, bool), starts)

    def _checked(self, ref: Ref, write: bool) -> int:
        if ref.sem:
            raise Unsupported("a load or store of a semaphore")
        b = ref.buffer
        shape = self.buffers[b].shape
        self.flag(any_of(outside(s, n, m) for s, n, m in zip(ref.starts, ref.sizes, shape)),
                  Verdict.OUT_OF_BOUNDS)
        if self.layout.races:
            self.flag(self._overlaps_in_flight(b, ref.starts, ref.sizes, write),
                      Verdict.RACE)
            self.coverage = self.coverage.at[0].add(1)
        return b

    def _overlaps_in_flight(self, b: int, starts: Sequence[Index], sizes: Sequence[int],
                            write: bool) -> jax.Array:
        """Whether a box of buffer `b` meets a DMA in flight: its destination (any
        access), or its source (a write)."""
        t = self.table
        start, size = padded(starts, 0), padded(sizes, 1)
        hit = t["active"] & (t["dst_buf"] == b) & meets(t["dst_start"], t["dst_size"],
                                                         start, size)
        if write:
            hit = hit | (t["active"] & (t["src_buf"] == b)
                         & meets(t["src_start"], t["src_size"], start, size))
        return jnp.any(hit)

    # -- DMAs ---------------------------------------------------------------------------

    def dma_start(self, key: tuple[object, ...], src: Ref, dst: Ref, cell: jax.Array) -> None:
        """A DMA starts: its boxes checked, a slot of the table taken (eager: it lands)."""
        src_info, dst_info = self.buffers[src.buffer], self.buffers[dst.buffer]
        nbytes = math.prod(dst.shape) * dst_info.dtype.itemsize
        if math.prod(src.shape) != math.prod(dst.shape) or src_info.dtype != dst_info.dtype:
            raise Unsupported("a DMA between views of other sizes or element types")
        site = self.layout.site(
            (*key, src_info.serial, dst_info.serial),
            DmaSite(src.buffer, dst.buffer, src_info.serial, dst_info.serial, src.sizes,
                    dst.sizes, nbytes))
        for ref in (src, dst):
            self.flag(any_of(outside(s, n, m) for s, n, m in
                           zip(ref.starts, ref.sizes, self.buffers[ref.buffer].shape)),
                      Verdict.OUT_OF_BOUNDS)
        if self.layout.races:
            self.flag(self._overlaps_in_flight(src.buffer, src.starts, src.sizes, False)
                      | self._overlaps_in_flight(dst.buffer, dst.starts, dst.sizes, True),
                      Verdict.RACE)
        t = self.table
        self.flag(jnp.all(t["active"]), Verdict.TABLE_FULL)
        slot = jnp.argmin(t["active"])
        row = jnp.concatenate([
            jnp.stack([i32(1), i32(0), i32(site), t.clock, i32(cell), i32(nbytes),
                       i32(src.buffer), i32(dst.buffer)]),
            padded(src.starts, 0), padded(src.sizes, 1), padded(dst.starts, 0),
            padded(dst.sizes, 1)])
        self.table = t.started(slot, row)
        if self.layout.races:  # its read and its write
            in_flight = jnp.sum(self.table["active"].astype(jnp.int32))
            self.coverage = self.coverage.at[0].add(2).at[1].max(in_flight)
        if self.layout.eager:
            self._land(slot)

    def _land(self, slot: jax.Array) -> None:
        """The DMA in `slot` moves its data and signals its semaphore. Each live site's
        copy is written where the slot's site is that site and leaves its box as it was
        elsewhere: straight-line code that XLA updates in place (a switch over the sites
        copied the buffers it carried at every landing)."""
        self.layout.landed = True
        t = self.table
        site_of = t["site"][slot]
        src_start, dst_start = t["src_start"][slot], t["dst_start"][slot]
        for k, site in enumerate(self.layout.sites):
            if self.live(site):
                self._land_site(site, site_of == k, src_start, dst_start)
        t = self.table
        self.counts = self.counts.at[t["sem"][slot]].add(t["bytes"][slot])
        self.table = t.set(slot, "landed", 1)

    def _land_site(self, site: DmaSite, this: jax.Array, src_start: jax.Array,
                   dst_start: jax.Array) -> None:
        src_at = [src_start[d] for d in range(len(site.src_sizes))]
        dst_at = [dst_start[d] for d in range(len(site.dst_sizes))]
        value = lax.dynamic_slice(self.values[site.src], src_at, site.src_sizes)
        shadow = self.shadows[site.src]
        if shadow is not None:
            self.flag(this & ~jnp.all(lax.dynamic_slice(shadow, src_at, site.src_sizes)),
                      Verdict.UNINITIALIZED)
        old = lax.dynamic_slice(self.values[site.dst], dst_at, site.dst_sizes)
        self.values[site.dst] = lax.dynamic_update_slice(
            self.values[site.dst], jnp.where(this, value.reshape(site.dst_sizes), old), dst_at)
        dst_shadow = self.shadows[site.dst]
        if dst_shadow is not None:
            old_shadow = lax.dynamic_slice(dst_shadow, dst_at, site.dst_sizes)
            self.shadows[site.dst] = lax.dynamic_update_slice(
                dst_shadow, old_shadow | this, dst_at)

    def wait(self, cell: jax.Array, wanted: Index, decrement: bool = True) -> None:
        """A wait for `wanted` on semaphore `cell`: DMAs on it land (on_wait) until the
        count covers it; a count that cannot is WAIT_UNMET (one core: nothing else will
        signal); then the count is taken and the DMAs it covers retire."""
        wanted = i32(wanted)
        if not self.layout.eager and self.layout.sites:
            def pending(t: Table) -> jax.Array:
                return t["active"] & ~t["landed"] & (t["sem"] == cell)

            targets = sorted(self.landing_targets())

            def more(carry: Carry) -> jax.Array:
                counts, t = carry[2], carry[3]
                return (counts[cell] < wanted) & jnp.any(pending(t))

            def land_newest(carry: Carry) -> Carry:
                self.restore(carry, targets)
                self._land(jnp.argmax(jnp.where(pending(self.table), self.table["age"], -1)))
                return self.carry(targets)

            before = self.snapshot()
            carry = lax.while_loop(more, land_newest, self.carry(targets))
            self.reset(before)
            self.restore(carry, targets)
        met = self.counts[cell] >= wanted
        self.flag(~met, Verdict.WAIT_UNMET)
        if decrement:
            self.counts = self.counts.at[cell].add(-jnp.where(met, wanted, 0))
        self._retire(cell, wanted)

    def _retire(self, cell: jax.Array, wanted: jax.Array) -> None:
        def landed(t: Table) -> jax.Array:
            return t["active"] & t["landed"] & (t["sem"] == cell)

        def more(carry: tuple[jax.Array, Table]) -> jax.Array:
            left, t = carry
            return (left > 0) & jnp.any(landed(t))

        def retire_newest(carry: tuple[jax.Array, Table]) -> tuple[jax.Array, Table]:
            left, t = carry
            slot = jnp.argmax(jnp.where(landed(t), t["age"], -1))
            return left - t["bytes"][slot], t.set(slot, "active", 0)

        _, self.table = lax.while_loop(more, retire_newest, (wanted, self.table))

    def signal(self, cell: jax.Array, amount: Index) -> None:
        self.counts = self.counts.at[cell].add(i32(amount))

    def finish(self) -> None:
        """The kernel's end: DMAs never waited, semaphores left with a count."""
        self.flag(jnp.any(self.table["active"]), Verdict.DMA_NOT_WAITED)
        self.flag(jnp.any(self.counts != 0), Verdict.SEMAPHORE_LEFT)
