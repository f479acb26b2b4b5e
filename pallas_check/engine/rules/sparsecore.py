"""Rules for the SparseCore primitives of a kernel jaxpr (`jax.experimental.pallas.tpu_sc`,
issue 28): subcore barriers and synchronisation, vector ops (gathers, scatters, compressed
loads and stores, scans, sorts, packing) and `parallel_loop`.

Rules register by primitive OBJECT (jaxpr/registry.py): SparseCore primitives share their
names with others (`load`, `swap`, `gather`, `scatter`, `bitcast`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pallas_check.jaxbridge import sc_core
from pallas_check.jaxbridge import sc_primitives

from pallas_check.engine.dma.devices import _core_index
from pallas_check.engine.jaxpr.errors import KernelError
from pallas_check.engine.jaxpr.program import current_frames, eval_jaxpr
from pallas_check.engine.jaxpr.registry import rule
from pallas_check.engine.memory.buffer import RefView
from pallas_check.engine.memory.region import index_region
from pallas_check.engine.runtime.barrier import SubcoreBarrier
from pallas_check.engine.runtime.scheduler import Wait


# -- barrier / sync (SC-C)

def _sparsecore_place(ctx: Any, what: str) -> tuple[int, int, str]:
    """(core, subcore, subcore axis name) of a vector subcore: a VectorSubcoreMesh's axes
    are (core axis, subcore axis), in that order (`mesh.shape`)."""
    axes = list(ctx.core_coords)
    if len(axes) != 2:
        raise KernelError(f"{what} needs a kernel over a plsc.VectorSubcoreMesh (core and"
                          f" subcore axes)", current_frames(ctx))
    return ctx.core_coords[axes[0]], ctx.core_coords[axes[1]], axes[1]


def _barrier_of(ctx: Any, core: int) -> SubcoreBarrier:
    """The barrier of this subcore's SparseCore (one per device and core), its members
    every subcore of that core in this call."""
    state = ctx.call
    barrier = state.subcore_barriers.get((ctx.device_id, core))
    if barrier is None:
        members = {}
        for other in state.contexts:
            if other.device_id == ctx.device_id and len(other.core_coords) == 2:
                c, s = other.core_coords.values()
                if c == core:
                    members[s] = _root_actor(other.actor)
        where = f"device {ctx.device_id} sparsecore {core}"
        barrier = state.subcore_barriers[(ctx.device_id, core)] = SubcoreBarrier(where, members)
    return barrier


@rule(sc_primitives.barrier_p, generator=True)
def _subcore_barrier(ctx, eqn, invals):
    """`plsc.subcore_barrier()`: waits for every subcore of this SparseCore; for the race
    checker, all each of them did before arriving happens before all any does after."""
    core, subcore, _ = _sparsecore_place(ctx, "plsc.subcore_barrier()")
    barrier = _barrier_of(ctx, core)
    frames = current_frames(ctx)
    generation = barrier.arrive(subcore, frames)
    key = ("sparsecore barrier", ctx.device_id, core, generation)
    ctx.call.on_subcore_barrier(ctx, key, False)
    if not barrier.opened(generation):
        yield Wait(lambda: barrier.opened(generation), "subcore barrier", frames,
                   semaphore=f"the subcore barrier of {barrier.where}",
                   wanted=len(barrier.members), current=barrier)
    ctx.call.on_subcore_barrier(ctx, key, True)
    return []


def signal_device_id(ctx: Any, device_id: Any, sem: Any) -> Any:
    """The device id a `pl.semaphore_signal` really goes to. In a VectorSubcoreMesh kernel
    Mosaic drops the core and subcore axes of a `device_id` dict when the semaphore is an
    ordinary one (lowering.py `_device_id_to_logical`: same core type, no core-typed memory
    space: "short circuit for same core semaphores"): `tpu.sem_signal` gets no core or
    subcore operand and signals the signaller's OWN semaphore. Simulated as the chip does
    it, with a finding at the signal when it names another subcore than the signaller's."""
    if not isinstance(device_id, dict) or not isinstance(ctx.call.core_mesh,
                                                         sc_core.VectorSubcoreMesh):
        return device_id
    named = {k: int(np.asarray(v)) for k, v in device_id.items() if k in ctx.core_coords}
    if not named:
        return device_id
    if any(ctx.core_coords[k] != v for k, v in named.items()):
        view = sem if isinstance(sem, RefView) else None
        shown = ", ".join(f"{k!r}: {v}" for k, v in named.items())
        ctx.call.add(ctx.call.checkers.signal_not_remote(
            ctx.call, ctx, view.buffer.name if view is not None else "semaphore",
            "{" + shown + "}", _root_actor(ctx.actor), current_frames(ctx)))
    rest = {k: v for k, v in device_id.items() if k not in named}
    return rest or None


def _root_actor(name: str) -> str:
    """The subcore an actor name belongs to (an iteration of a parallel_loop is named
    after its subcore, see `_parallel_loop`)."""
    return name.split(" (parallel_loop", 1)[0]


@rule(sc_primitives.fetch_and_add_p)
def _fetch_and_add(ctx, eqn, invals):
    """`plsc.fetch_and_add(x_smem.at[i], v, subcore_id=s)`: adds v to subcore s's copy of
    the SMEM cell (same SparseCore), atomically, and returns the old value. For the race
    checker an atomic add: concurrent fetch_and_adds of the cell never race; the owner's
    plain reads and writes do, unless a barrier orders them."""
    ref, value, *indices, subcore_id = invals
    _, _, subcore_axis = _sparsecore_place(ctx, "plsc.fetch_and_add")
    target = int(np.asarray(subcore_id))
    size = ctx.core_mesh_sizes()[subcore_axis]
    if not 0 <= target < size:
        raise KernelError(f"fetch_and_add: subcore_id={target} is outside the {size}"
                          f" subcores of the SparseCore", current_frames(ctx))
    assert isinstance(ref, RefView)
    buf = ref.buffer
    core = _core_index(ctx, {subcore_axis: target})
    other = ctx.call.remote(buf, ctx.device_id, current_frames(ctx), core)
    region = index_region(other, [tuple(int(np.asarray(i)) for i in indices)])
    if region.oob:
        ctx.call.out_of_bounds(ctx, region, "fetch_and_add", None)
        return np.int32(0)
    if not other.fully_written:
        unwritten = ~region.read_written()
        if unwritten.any():
            ctx.call.uninitialized_read(ctx, region, int(unwritten.sum()), unwritten)
    fill = ctx.fill(other.data.dtype)
    old = np.asarray(region.read(fill)).astype(np.int32)
    region.write(old + np.int32(np.asarray(value)), fill)
    ctx.call.access(ctx, region, True, "fetch_and_add", atomic_add=True)
    return old.reshape(())


# -- vector ops (SC-B)


# -- parallel_loop (SC-C)

# One race-clock slot per iteration, up to this many per loop: iterations this far apart
# share a slot and are taken as ordered (a loop's clocks stay bounded); any closer two
# iterations are concurrent, as the chip may overlap or reorder them.
ITERATION_SLOTS = 64


class IterationClocks:
    """The race checker's side of `parallel_loop` (a hook of the loop rule): each iteration
    is an actor of its own, forked from the subcore when the loop begins and joined when it
    ends, so a read of another iteration's write (or two iterations writing one element) is
    a race, as the chip may overlap or reorder iterations (JAX's parallel_loop docstring:
    iterations depend on one another only through the carry). While an iteration runs,
    the context's actor is the iteration (`core 3 (parallel_loop iteration i=16)`): its
    accesses, DMAs, signals and waits are the iteration's. With races off: nothing."""

    def loop_started(self, ctx: Any, eqn: Any) -> None:
        races = ctx.call.races
        if races is not None:
            ctx.parallel_loops.append([ctx.actor, races.loop_began(ctx.actor), {}, 0])

    def iteration_started(self, ctx: Any, eqn: Any, index: int) -> None:
        races = ctx.call.races
        if races is None:
            return
        loop = ctx.parallel_loops[-1]
        parent, base, _, count = loop
        ctx.actor = f"{parent} (parallel_loop iteration i={index})"
        races.fork_iteration(base, ctx.actor,
                             f"{parent} parallel_loop slot {count % ITERATION_SLOTS}")
        loop[3] = count + 1

    def iteration_ended(self, ctx: Any, eqn: Any, index: int) -> None:
        races = ctx.call.races
        if races is None:
            return
        loop = ctx.parallel_loops[-1]
        races.join_iteration(loop[2], ctx.actor)
        ctx.actor = loop[0]

    def loop_ended(self, ctx: Any, eqn: Any) -> None:
        races = ctx.call.races
        if races is not None:
            parent, _, joined, _ = ctx.parallel_loops.pop()
            races.loop_ended(parent, joined)


# (lead: SC-B's vector-op section defines the same hook list and the loop rule calling it,
# for the values; keep theirs and register IterationClocks in it. These two stand in for
# them on this branch alone.)
PARALLEL_LOOP_HOOKS: list[Any] = [IterationClocks()]


@rule(sc_primitives.parallel_loop_p, generator=True, body_only=True)
def _parallel_loop(ctx, eqn, invals):
    """`@plsc.parallel_loop(lo, hi, step, carry=...)`: the iterations in order for their
    values (only the carry chains them); the hooks model their concurrency."""
    lower, upper, step, consts, carry = eqn.params["tree"].unflatten(invals)
    lower, upper, step = (int(np.asarray(x)) for x in (lower, upper, step))
    body, hooks = eqn.params["jaxpr"], PARALLEL_LOOP_HOOKS
    carry = list(carry)
    for hook in hooks:
        hook.loop_started(ctx, eqn)
    for i in range(lower, upper, step):
        for hook in hooks:
            hook.iteration_started(ctx, eqn, i)
        carry = list((yield from eval_jaxpr(ctx, body, consts, [np.int32(i), *carry])))
        for hook in hooks:
            hook.iteration_ended(ctx, eqn, i)
    for hook in hooks:
        hook.loop_ended(ctx, eqn)
    return carry
