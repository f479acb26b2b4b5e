"""Rules for the SparseCore primitives of a kernel jaxpr (`jax.experimental.pallas.tpu_sc`,
issue 28): subcore barriers and synchronisation, vector ops (gathers, scatters, compressed
loads and stores, scans, sorts, packing) and `parallel_loop`.

Rules register by primitive OBJECT (jaxpr/registry.py): SparseCore primitives share their
names with others (`load`, `swap`, `gather`, `scatter`, `bitcast`).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol, cast

import numpy as np

from pallas_check.jaxbridge import params as eqn_params
from pallas_check.jaxbridge.primitives import sc_all_reduce_ffs_p, sc_all_reduce_population_count_p, sc_barrier_p, sc_bitcast_p, sc_fetch_and_add_p, sc_gather_p, sc_load_p, sc_masked_cummax_p, sc_masked_cummin_p, sc_masked_cumsum_p, sc_masked_sort_p, sc_pack_p, sc_parallel_loop_p, sc_scan_count_p, sc_scatter_p, sc_swap_p, sc_unpack_p
from pallas_check.jaxbridge.types import JaxprEqn, NDIndexer, Slice, VectorSubcoreMesh
from pallas_check.engine.dma.devices import _core_index
from pallas_check.engine.events import LoopIteration, ParallelLoop, event_kind
from pallas_check.engine.verdicts import Where
from pallas_check.engine.jaxpr.halts import KernelError
from pallas_check.engine.jaxpr.program import current_frames, eval_jaxpr
from pallas_check.engine.jaxpr.avals import aval_dtype, aval_shape
from pallas_check.engine.jaxpr.registry import RuleGen, rule
from pallas_check.engine.memory.buffer import RefView
from pallas_check.engine.memory.region import Region, index_region
from pallas_check.engine.rules import access, sc_values
from pallas_check.engine.rules.sc_lanes import Lanes
from pallas_check.engine.runtime.barrier import SubcoreBarrier
from pallas_check.engine.runtime.scheduler import Wait
from pallas_check.engine.seam import LoopInProgress, RunningCore


# -- barrier / sync (SC-C)

def _sparsecore_place(ctx: RunningCore, what: str) -> tuple[int, int, str]:
    """(core, subcore, subcore axis name) of a vector subcore: a VectorSubcoreMesh's axes
    are (core axis, subcore axis), in that order (`mesh.shape`)."""
    axes = list(ctx.core_coords)
    if len(axes) != 2:
        raise KernelError(f"{what} needs a kernel over a plsc.VectorSubcoreMesh (core and"
                          f" subcore axes)", current_frames(ctx))
    return ctx.core_coords[axes[0]], ctx.core_coords[axes[1]], axes[1]


def _barrier_of(ctx: RunningCore, core: int) -> SubcoreBarrier:
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


@rule(sc_barrier_p, generator=True)
def _subcore_barrier(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> RuleGen:
    """`plsc.subcore_barrier()`: waits for every subcore of this SparseCore; for the race
    checker, all each of them did before arriving happens before all any does after."""
    core, subcore, _ = _sparsecore_place(ctx, "plsc.subcore_barrier()")
    barrier = _barrier_of(ctx, core)
    frames = current_frames(ctx)
    generation = barrier.arrive(subcore, frames)
    ctx.call.on_subcore_barrier(ctx, core, generation, False)
    if not barrier.opened(generation):
        yield Wait(lambda: barrier.opened(generation), "subcore barrier", frames,
                   semaphore=f"the subcore barrier of {barrier.where}",
                   wanted=len(barrier.members), current=barrier)
    ctx.call.on_subcore_barrier(ctx, core, generation, True)
    return []


@event_kind
class SignalNotRemote(NamedTuple):
    """A `pl.semaphore_signal` in a SparseCore vector-subcore kernel naming another subcore
    (`named`, as the kernel wrote its device id): Mosaic lowers it to a signal of the
    signaller's (`where.actor`) own `semaphore` (checkers/semaphores.py reports it)."""

    where: Where
    semaphore: str
    named: str


def signal_device_id(ctx: RunningCore, device_id: object, sem: object) -> object:
    """The device id a `pl.semaphore_signal` really goes to. In a VectorSubcoreMesh kernel
    Mosaic drops the core and subcore axes of a `device_id` dict when the semaphore is an
    ordinary one (lowering.py `_device_id_to_logical`: same core type, no core-typed memory
    space: "short circuit for same core semaphores"): `tpu.sem_signal` gets no core or
    subcore operand and signals the signaller's OWN semaphore. Simulated as the chip does
    it, with a finding at the signal when it names another subcore than the signaller's."""
    if not isinstance(device_id, dict) or not isinstance(ctx.call.core_mesh,
                                                         VectorSubcoreMesh):
        return device_id
    named = {k: int(np.asarray(v)) for k, v in device_id.items() if k in ctx.core_coords}
    if not named:
        return device_id
    if any(ctx.core_coords[k] != v for k, v in named.items()):
        view = sem if isinstance(sem, RefView) else None
        shown = ", ".join(f"{k!r}: {v}" for k, v in named.items())
        if ctx.call.feeds.takes(SignalNotRemote):
            where = Where(_root_actor(ctx.actor), ctx.device_id, ctx.core_id, ctx.grid_point,
                          current_frames(ctx))
            ctx.call.tell(SignalNotRemote(where, view.buffer.name if view is not None
                                          else "semaphore", "{" + shown + "}"))
    rest = {k: v for k, v in device_id.items() if k not in named}
    return rest or None


def _root_actor(name: str) -> str:
    """The subcore an actor name belongs to (an iteration of a parallel_loop is named
    after its subcore, see `_parallel_loop`)."""
    return name.split(" (parallel_loop", 1)[0]


@rule(sc_fetch_and_add_p)
def _fetch_and_add(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> object:
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
# Memory ops go through rules/access.py's `access_read` / `access_write` (bounds, the
# written-shadow, races), on exactly the elements the active lanes touch (sc_lanes.py's
# regions, for a gather or scatter); value ops are
# sc_values.py's numpy functions. Lanes the hardware leaves undefined hold the fill value.
# A value op's operands are vectors: numpy arrays, or jax.Arrays a compiled segment made,
# which numpy reads alike (`invals: list[np.ndarray]`).

@rule(sc_gather_p)
def _load_gather(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> object:
    """`load_gather(ref, [i0, i1, ...], mask=m)`: out[j] = ref[i0[j], i1[j], ...] for each
    active lane j, each an element read (bounds, shadow, races); other lanes undefined."""
    ref, transforms, indices, mask = eqn_params.operand_tree(eqn).unflatten(invals)
    lanes = Lanes(ctx, ref, transforms, indices, mask)
    on = lanes.on
    dtype = aval_dtype(eqn.outvars[0])
    out = np.full(len(lanes.lanes), ctx.fill(dtype), dtype=dtype)
    for j in range(len(lanes.lanes)):
        if on[j]:
            region = lanes.region(j, f"load_gather lane {j}")
            if region is not None:
                out[j] = np.asarray(access.access_read(ctx, None, region=region)).reshape(())
    _undefined(ctx, lanes.view, int((~on).sum()), "load_gather")
    return out


def _undefined(ctx: RunningCore, view: RefView, count: int, op: str) -> None:
    """The masked-off lanes of a masked load are undefined (they hold the fill value)."""
    if count:
        ctx.call.undefined_lanes(ctx, f"masked-off lanes of {op}({view.buffer.name})", count,
                                 f"{count} masked-off lanes of a {op} are undefined")


_CONFLICT = np.zeros((), np.void)  # an element several lanes store different values to


@rule(sc_scatter_p)
def _store_scatter(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> object:
    """`store_scatter` / `addupdate_scatter`: ref[i[j]] = x[j] (or += x[j]) for each active
    lane j, in lane order. Adds to one element from several lanes accumulate. Several
    active lanes storing DIFFERENT values to one element: which lane wins is unspecified
    (hardware order), so the element holds the fill value -- undefined, and reported like
    never-written memory when it reaches an output; equal values store that value."""
    ref, transforms, indices, x, mask = eqn_params.operand_tree(eqn).unflatten(invals)
    add = eqn_params.adds(eqn)
    lanes = Lanes(ctx, ref, transforms, indices, mask)
    x = np.asarray(x).reshape(-1)
    name = "addupdate_scatter" if add else "store_scatter"
    stores: dict[tuple[int, ...], np.ndarray] = {}
    for j, lane in enumerate(lanes.lanes):
        if not lanes.on[j]:
            continue
        region = lanes.region(j, f"{name} lane {j}")
        if region is None:
            continue
        if add:  # atomic: lanes, loop iterations and subcores adding never race
            access.access_atomic_add(ctx, None, x[j], name, region=region)
            continue
        value = x[j]
        if lane in stores and stores[lane].tobytes() != value.tobytes():
            if stores[lane] is not _CONFLICT:
                ctx.call.undefined_lanes(ctx, name, 1, f"{name} lanes store different values"
                                         " to one element: which lands is unspecified", region)
            stores[lane] = _CONFLICT
            value = np.asarray(ctx.fill(x.dtype), dtype=x.dtype)  # lanes disagree
        else:
            stores[lane] = value
        access.access_write(ctx, None, value, region=region)
    return []


def _first(view: RefView, shape: tuple[int, ...], n: int) -> RefView:
    """The first n elements of a 1-D view (what a compressed load or store touches)."""
    indexer = NDIndexer(indices=(Slice(0, n, 1),), shape=shape,
                                       int_indexer_shape=())
    return view.with_transforms((indexer,))


def _compressed_part(ctx: RunningCore, eqn: JaxprEqn, ref: object, flat: list[object]
                     ) -> tuple[RefView | None, np.ndarray]:
    """(view of the first popcount(mask) elements, mask) of a masked SparseCore load or
    store (n = 0: None); a view of rank > 1 is touched whole, its mask selecting."""
    *transforms, mask = flat
    view = access.view_of(ref, eqn_params.operand_tree(eqn).unflatten(transforms))
    mask = np.asarray(mask, bool)
    n = int(mask.sum())
    if n == 0:
        return None, mask
    if mask.ndim != 1:
        return view, mask
    return _first(view, (mask.shape[0],), n), mask


@rule(sc_load_p)
def _sc_load(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> object:
    """SparseCore `load`: without a mask a plain load; with one, `load_expanded`: the i-th
    active lane reads ref[i] (only ref[0:popcount] is touched), the others undefined."""
    ref, *flat = invals
    dtype = aval_dtype(eqn.outvars[0])
    if not eqn_params.has_mask(eqn):
        plain = access.view_of(ref, eqn_params.operand_tree(eqn).unflatten(flat))
        return access.access_read(ctx, plain).astype(dtype)
    view, mask = _compressed_part(ctx, eqn, ref, flat)
    # (a ref: _compressed_part took a view of it)
    _undefined(ctx, cast(RefView, ref), int(mask.size - mask.sum()), "load_expanded")
    if view is None:
        return np.full(mask.shape, ctx.fill(dtype), dtype=dtype)
    if mask.ndim != 1:
        picked = (np.arange(mask.size) < mask.sum()).reshape(mask.shape)
        values = access.access_read(ctx, view, picked).reshape(-1)
    else:
        values = access.access_read(ctx, view)
    return sc_values.expand(np.asarray(values, dtype), mask, ctx.fill(dtype))


@rule(sc_swap_p)
def _sc_store(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> object:
    """SparseCore `swap`: `addupdate` (ref += x), `store_compressed` (ref[0:n] = x[mask]),
    `addupdate_compressed` (ref[0:n] += x[mask]); the result is x itself."""
    ref, x, *flat = invals
    x = np.asarray(x)
    view: RefView | None
    if not eqn_params.has_mask(eqn):
        view = access.view_of(ref, eqn_params.operand_tree(eqn).unflatten(flat))
        value = x
    else:
        view, mask = _compressed_part(ctx, eqn, ref, flat)
        if view is None:
            return x
        value = sc_values.compress(x, mask)
        if mask.ndim != 1:
            raise KernelError("a compressed store into a ref of rank > 1 is not simulated",
                              current_frames(ctx))
    if eqn_params.adds(eqn):  # `addupdate`: an atomic add
        access.access_atomic_add(ctx, view, value, "addupdate")
        return x
    access.access_write(ctx, view, value)
    return x


@rule(sc_masked_cumsum_p)
def _masked_cumsum(ctx: RunningCore, eqn: JaxprEqn, invals: list[np.ndarray]) -> object:
    return sc_values.masked_cumsum(*invals)


@rule(sc_masked_cummax_p)
def _masked_cummax(ctx: RunningCore, eqn: JaxprEqn, invals: list[np.ndarray]) -> object:
    return sc_values.masked_cummax(*invals)


@rule(sc_masked_cummin_p)
def _masked_cummin(ctx: RunningCore, eqn: JaxprEqn, invals: list[np.ndarray]) -> object:
    return sc_values.masked_cummin(*invals)


@rule(sc_masked_sort_p)
def _masked_sort(ctx: RunningCore, eqn: JaxprEqn, invals: list[np.ndarray]) -> object:
    keys, values, *mask = invals
    return sc_values.sort_key_val(keys, values, mask[0] if mask else None,
                                  eqn_params.descending(eqn))


@rule(sc_scan_count_p)
def _scan_count(ctx: RunningCore, eqn: JaxprEqn, invals: list[np.ndarray]) -> object:
    """Counts of masked-off lanes are undefined (ASSUMED, sc_values.scan_count)."""
    off = int(np.size(invals[1]) - np.count_nonzero(invals[1]))
    if off:
        ctx.call.undefined_lanes(ctx, "masked-off lanes of scan_count", off,
                                 f"{off} masked-off lanes of a scan_count are undefined")
    return sc_values.scan_count(invals[0], invals[1], ctx.fill(np.dtype(np.int32)))


@rule(sc_all_reduce_population_count_p)
def _population_count(ctx: RunningCore, eqn: JaxprEqn, invals: list[np.ndarray]) -> object:
    return sc_values.population_count(invals[0], eqn_params.reduces(eqn))


@rule(sc_all_reduce_ffs_p)
def _first_set(ctx: RunningCore, eqn: JaxprEqn, invals: list[np.ndarray]) -> object:
    return sc_values.first_set(invals[0], eqn_params.reduces(eqn))


@rule(sc_pack_p)
def _pack(ctx: RunningCore, eqn: JaxprEqn, invals: list[np.ndarray]) -> object:
    out = eqn.outvars[0]
    return sc_values.pack(invals[0], invals[1], eqn_params.pack_format(eqn),
                          aval_dtype(out), aval_shape(out))


@rule(sc_unpack_p)
def _unpack(ctx: RunningCore, eqn: JaxprEqn, invals: list[np.ndarray]) -> object:
    return sc_values.unpack(invals[0], eqn_params.pack_format(eqn),
                            aval_dtype(eqn.outvars[0]))


@rule(sc_bitcast_p)
def _bitcast(ctx: RunningCore, eqn: JaxprEqn, invals: list[np.ndarray]) -> object:
    return sc_values.bitcast(invals[0], eqn_params.target_dtype(eqn))


class ParallelLoopHooks(Protocol):
    """Who follows a `parallel_loop`'s iterations (the race checker's per-iteration clocks,
    SC-C's part): registered in PARALLEL_LOOP_HOOKS; none registered, none called."""

    def loop_started(self, ctx: RunningCore, eqn: JaxprEqn) -> None: ...

    def iteration_started(self, ctx: RunningCore, eqn: JaxprEqn, index: int) -> None: ...

    def iteration_ended(self, ctx: RunningCore, eqn: JaxprEqn, index: int) -> None: ...

    def loop_ended(self, ctx: RunningCore, eqn: JaxprEqn) -> None: ...


PARALLEL_LOOP_HOOKS: list[ParallelLoopHooks] = []


@rule(sc_parallel_loop_p, generator=True, body_only=True)
def _parallel_loop(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> RuleGen:
    """`parallel_loop(lower, upper, step, carry=...)`: the body per index, in order, the
    carry chaining them (the only dependence the hardware keeps between iterations; that
    the iterations are otherwise concurrent is for the hooks to model)."""
    lower, upper, step, consts, carry = eqn_params.operand_tree(eqn).unflatten(invals)
    lower, upper, step = int(np.asarray(lower)), int(np.asarray(upper)), int(np.asarray(step))
    if step <= 0:
        raise KernelError(f"parallel_loop with step {step}: expected a positive step",
                          current_frames(ctx))
    body, hooks = eqn_params.body(eqn), PARALLEL_LOOP_HOOKS
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
    accesses, DMAs, signals and waits are the iteration's. The moments go to the call's
    listeners as ParallelLoop / LoopIteration events (engine/events.py); where none takes
    iterations (races off), the actor stays the subcore and nothing is built."""

    def loop_started(self, ctx: RunningCore, eqn: JaxprEqn) -> None:
        if ctx.call.feeds.loop_iteration:  # (the race checker's, with races on)
            ctx.parallel_loops.append(LoopInProgress(ctx.actor))
        if ctx.call.feeds.parallel_loop:
            event = ParallelLoop(ctx.actor, True)
            for take in ctx.call.feeds.parallel_loop:
                take(event)

    def iteration_started(self, ctx: RunningCore, eqn: JaxprEqn, index: int) -> None:
        takers = ctx.call.feeds.loop_iteration
        if not takers:
            return
        loop = ctx.parallel_loops[-1]
        parent, count = loop.actor, loop.iterations
        ctx.actor = f"{parent} (parallel_loop iteration i={index})"
        event = LoopIteration(parent, ctx.actor,
                              f"{parent} parallel_loop slot {count % ITERATION_SLOTS}", True)
        loop.iterations = count + 1
        for take in takers:
            take(event)

    def iteration_ended(self, ctx: RunningCore, eqn: JaxprEqn, index: int) -> None:
        takers = ctx.call.feeds.loop_iteration
        if not takers:
            return
        parent = ctx.parallel_loops[-1].actor
        event = LoopIteration(parent, ctx.actor, "", False)
        for take in takers:
            take(event)
        ctx.actor = parent

    def loop_ended(self, ctx: RunningCore, eqn: JaxprEqn) -> None:
        if ctx.call.feeds.loop_iteration:
            ctx.parallel_loops.pop()  # (its iterations ended: the actor is the loop's again)
        if ctx.call.feeds.parallel_loop:
            event = ParallelLoop(ctx.actor, False)
            for take in ctx.call.feeds.parallel_loop:
                take(event)


PARALLEL_LOOP_HOOKS.append(IterationClocks())
