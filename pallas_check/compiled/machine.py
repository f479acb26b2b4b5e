"""The compiled call's machine: its buffers and what the kernel's loads and stores do.

The state it carries and how control flow hands it over is state.py's; DMAs and semaphores
are dma.py's; the DMA table's layout is table.py's. This module adds buffers and scoped
allocations, loads and stores (bounds, never-written reads, races with DMAs in flight) and
the checks at a scope's end and the kernel's end.
"""

from __future__ import annotations

import dataclasses
import math
import jax
import jax.numpy as jnp

from pallas_check.compiled.boxes import MAX_RANK, all_set, any_of, outside, put, take
from pallas_check.compiled.dma import Dmas
from pallas_check.compiled.refs import BufferInfo, Ref, SemInfo, Unsupported
from pallas_check.compiled.verdict import Verdict
from pallas_check.engine.memory.buffer import fill_value


class Machine(Dmas):
    """The call's state at one point of tracing, and what acts on it."""

    # -- buffers and semaphores --------------------------------------------------------

    def add_buffer(self, info: BufferInfo, value: jax.Array | None = None,
                   written: bool = False, whole_shadow: bool = False) -> int:
        """A new buffer (`value`, or the never-written fill), numbered in order.
        `whole_shadow`: its shadow may be one bool (a scratch buffer or an output block,
        which the kernel mostly reads and writes whole; `State.written_in`)."""
        if len(info.shape) > MAX_RANK:
            raise Unsupported(f"a buffer of rank {len(info.shape)}")
        if value is None:
            value = jnp.full(info.shape, fill_value(info.dtype, self.layout.fill), info.dtype)
        info = dataclasses.replace(info, serial=self.allocations)
        self.allocations += 1
        self.buffers.append(info)
        self.values.append(value)
        coarse = whole_shadow and info.serial not in self.layout.fine_shadows
        self.shadows.append(jnp.full(() if coarse else info.shape, written)
                            if info.tracked else None)
        return len(self.buffers) - 1

    def add_semaphores(self, name: str, shape: tuple[int, ...], counts_bytes: bool) -> int:
        base = int(self.counts.shape[0])
        self.semaphores.append(SemInfo(name, base, tuple(shape), counts_bytes))
        self.counts = jnp.concatenate([self.counts, jnp.zeros(math.prod(shape), jnp.int32)])
        return len(self.semaphores) - 1

    def free(self, buffers: int, semaphores: int) -> None:
        """The end of a scope: its allocations, the last made, are checked and dropped
        (the DMAs started in it are written into the table first, then forgotten)."""
        self.forget()
        for _ in range(buffers):
            info, shadow = self.buffers.pop(), self.shadows.pop()
            self.values.pop()
            if info.scratch and shadow is not None:
                self.flag(~all_set(shadow), Verdict.UNTOUCHED)
        alive = len(self.buffers)  # a DMA in flight to or from a buffer gone: never waited
        t = self.table
        if self.maybe_active:
            self.flag(jnp.any(t["active"] & ((t["src_buf"] >= alive)
                                             | (t["dst_buf"] >= alive))),
                      Verdict.DMA_NOT_WAITED)
        for _ in range(semaphores):
            sem = self.semaphores.pop()
            self.flag(jnp.any(self.counts[sem.base:] != 0), Verdict.SEMAPHORE_LEFT)
            self.counts = self.counts[:sem.base]

    # -- kernel accesses ----------------------------------------------------------------

    def read(self, ref: Ref, check_written: bool = True) -> jax.Array:
        b = self._checked(ref, write=False)
        value = take(self.values[b], ref.starts, ref.sizes)
        if check_written and self.shadows[b] is not None:
            self.flag(~self.written_in(b, ref.starts, ref.sizes), Verdict.UNINITIALIZED)
        return value.reshape(ref.shape)

    def write(self, ref: Ref, value: jax.Array) -> None:
        b = self._checked(ref, write=True)
        info = self.buffers[b]
        value = jnp.asarray(value).astype(info.dtype).reshape(ref.sizes)
        self.values[b] = put(self.values[b], value, ref.starts)
        self.mark_written(b, ref.starts, ref.sizes)

    def _checked(self, ref: Ref, write: bool) -> int:
        if ref.sem:
            raise Unsupported("a load or store of a semaphore")
        b = ref.buffer
        shape = self.buffers[b].shape
        self.flag(any_of(outside(s, n, m) for s, n, m in zip(ref.starts, ref.sizes, shape)),
                  Verdict.OUT_OF_BOUNDS)
        if self.layout.races:
            self.flag(self.overlaps_in_flight(b, ref.starts, ref.sizes, write),
                      Verdict.RACE)
            self.note_checked(1)
        return b

    def finish(self) -> None:
        """The kernel's end: DMAs never waited, semaphores left with a count."""
        self.write_started()
        self.flush_coverage()
        if self.maybe_active:
            self.flag(jnp.any(self.table["active"]), Verdict.DMA_NOT_WAITED)
        self.flag(jnp.any(self.counts != 0), Verdict.SEMAPHORE_LEFT)
