"""Rules for the SparseCore primitives of a kernel jaxpr (`jax.experimental.pallas.tpu_sc`,
issue 28): subcore barriers and synchronisation, vector ops (gathers, scatters, compressed
loads and stores, scans, sorts, packing) and `parallel_loop`.

Rules register by primitive OBJECT (jaxpr/registry.py): SparseCore primitives share their
names with others (`load`, `swap`, `gather`, `scatter`, `bitcast`).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
from pallas_check.jaxbridge import sc_primitives
from pallas_check.jaxbridge import state_indexing

from pallas_check.engine.jaxpr.errors import KernelError
from pallas_check.engine.jaxpr.program import current_frames, eval_jaxpr
from pallas_check.engine.jaxpr.registry import rule
from pallas_check.engine.memory.buffer import RefView
from pallas_check.engine.rules import access, sc_values


# -- barrier / sync (SC-C)


# -- vector ops (SC-B)
# Memory ops go through rules/access.py's `access_read` / `access_write` (bounds, the
# written-shadow, races), on exactly the elements the active lanes touch; value ops are
# sc_values.py's numpy functions. Lanes the hardware leaves undefined hold the fill value.

def _lane_view(view: RefView, shape: tuple[int, ...], lane_index: tuple[int, ...]) -> RefView:
    """The one element of `view` (of `shape`) a gather/scatter lane addresses."""
    indexer = state_indexing.NDIndexer(indices=lane_index, shape=shape, int_indexer_shape=())
    return view.with_transforms((indexer,))


def _view_shape(ctx: Any, view: RefView) -> tuple[int, ...]:
    region = access._resolve(ctx, view)
    if not region.post:
        return region.out_shape
    return tuple(region.read(ctx.fill(view.buffer.data.dtype)).shape)


def _lanes(ref: Any, transforms: Any, indices: Any, mask: Any):
    """(view, per-lane index tuples, active lanes) of a load_gather / store_scatter."""
    view = access.view_of(ref, transforms)
    columns = [np.asarray(i).astype(np.int64).reshape(-1) for i in indices]
    n = columns[0].shape[0]
    return view, [tuple(int(c[j]) for c in columns) for j in range(n)], sc_values.active(mask, n)


def _lane_region(ctx: Any, view: RefView, shape: tuple, lane: tuple, operation: str):
    region = access._resolve(ctx, _lane_view(view, shape, lane), operation)
    if region.oob:  # the finding names the lane: `load_gather lane 3 of x_v[40] ...`
        ctx.call.out_of_bounds(ctx, region, operation, None)
        return None
    return region


@rule(sc_primitives.gather_p)
def _load_gather(ctx, eqn, invals):
    """`load_gather(ref, [i0, i1, ...], mask=m)`: out[j] = ref[i0[j], i1[j], ...] for each
    active lane j, each an element read (bounds, shadow, races); other lanes undefined."""
    ref, transforms, indices, mask = eqn.params["tree"].unflatten(invals)
    view, lanes, on = _lanes(ref, transforms, indices, mask)
    dtype = np.dtype(eqn.outvars[0].aval.dtype)
    out = np.full(len(lanes), ctx.fill(dtype), dtype=dtype)
    shape = _view_shape(ctx, view)
    for j, lane in enumerate(lanes):
        if on[j]:
            region = _lane_region(ctx, view, shape, lane, f"load_gather lane {j}")
            if region is not None:
                out[j] = np.asarray(access.access_read(ctx, None, region=region)).reshape(())
    _undefined(ctx, view, int((~on).sum()), "load_gather")
    return out


def _undefined(ctx: Any, view: RefView, count: int, op: str) -> None:
    """The masked-off lanes of a masked load are undefined (they hold the fill value)."""
    if count:
        ctx.call.undefined_lanes(ctx, f"masked-off lanes of {op}({view.buffer.name})", count,
                                 f"{count} masked-off lanes of a {op} are undefined")


_CONFLICT = np.zeros((), np.void)  # an element several lanes store different values to


@rule(sc_primitives.scatter_p)
def _store_scatter(ctx, eqn, invals):
    """`store_scatter` / `addupdate_scatter`: ref[i[j]] = x[j] (or += x[j]) for each active
    lane j, in lane order. Adds to one element from several lanes accumulate. Several
    active lanes storing DIFFERENT values to one element: which lane wins is unspecified
    (hardware order), so the element holds the fill value -- undefined, and reported like
    never-written memory when it reaches an output; equal values store that value."""
    ref, transforms, indices, x, mask = eqn.params["tree"].unflatten(invals)
    add = eqn.params["add"]
    view, lanes, on = _lanes(ref, transforms, indices, mask)
    x = np.asarray(x).reshape(-1)
    shape = _view_shape(ctx, view)
    name = "addupdate_scatter" if add else "store_scatter"
    stores: dict[tuple, Any] = {}
    for j, lane in enumerate(lanes):
        if not on[j]:
            continue
        region = _lane_region(ctx, view, shape, lane, f"{name} lane {j}")
        if region is None:
            continue
        if add:
            old = np.asarray(access.access_read(ctx, None, region=region))
            access.access_write(ctx, None, old + x[j].astype(old.dtype), region=region)
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
    indexer = state_indexing.NDIndexer(indices=(state_indexing.Slice(0, n, 1),), shape=shape,
                                       int_indexer_shape=())
    return view.with_transforms((indexer,))


def _compressed_part(ctx: Any, eqn: Any, ref: Any, flat: list):
    """(view of the first popcount(mask) elements, mask) of a masked SparseCore load or
    store (n = 0: None); a view of rank > 1 is touched whole, its mask selecting."""
    *transforms, mask = flat
    view = access.view_of(ref, eqn.params["tree"].unflatten(transforms))
    mask = np.asarray(mask, bool)
    n = int(mask.sum())
    if n == 0:
        return None, mask
    if mask.ndim != 1:
        return view, mask
    return _first(view, (mask.shape[0],), n), mask


@rule(sc_primitives.load_p)
def _sc_load(ctx, eqn, invals):
    """SparseCore `load`: without a mask a plain load; with one, `load_expanded`: the i-th
    active lane reads ref[i] (only ref[0:popcount] is touched), the others undefined."""
    ref, *flat = invals
    dtype = np.dtype(eqn.outvars[0].aval.dtype)
    if not eqn.params["has_mask"]:
        view = access.view_of(ref, eqn.params["tree"].unflatten(flat))
        return access.access_read(ctx, view).astype(dtype)
    view, mask = _compressed_part(ctx, eqn, ref, flat)
    _undefined(ctx, ref, int(mask.size - mask.sum()), "load_expanded")
    if view is None:
        return np.full(mask.shape, ctx.fill(dtype), dtype=dtype)
    if mask.ndim != 1:
        picked = (np.arange(mask.size) < mask.sum()).reshape(mask.shape)
        values = access.access_read(ctx, view, picked).reshape(-1)
    else:
        values = access.access_read(ctx, view)
    return sc_values.expand(np.asarray(values, dtype), mask, ctx.fill(dtype))


@rule(sc_primitives.swap_p)
def _sc_store(ctx, eqn, invals):
    """SparseCore `swap`: `addupdate` (ref += x), `store_compressed` (ref[0:n] = x[mask]),
    `addupdate_compressed` (ref[0:n] += x[mask]); the result is x itself."""
    ref, x, *flat = invals
    x = np.asarray(x)
    if not eqn.params["has_mask"]:
        view = access.view_of(ref, eqn.params["tree"].unflatten(flat))
        value = x
    else:
        view, mask = _compressed_part(ctx, eqn, ref, flat)
        if view is None:
            return x
        value = sc_values.compress(x, mask)
        if mask.ndim != 1:
            raise KernelError("a compressed store into a ref of rank > 1 is not simulated",
                              current_frames(ctx))
    if eqn.params["add"]:
        old = access.access_read(ctx, view)
        value = old + value.astype(old.dtype)
    access.access_write(ctx, view, value)
    return x


@rule(sc_primitives.masked_cumsum_p)
def _masked_cumsum(ctx, eqn, invals):
    return sc_values.masked_cumsum(*invals)


@rule(sc_primitives.masked_cummax_p)
def _masked_cummax(ctx, eqn, invals):
    return sc_values.masked_cummax(*invals)


@rule(sc_primitives.masked_cummin_p)
def _masked_cummin(ctx, eqn, invals):
    return sc_values.masked_cummin(*invals)


@rule(sc_primitives.masked_sort_p)
def _masked_sort(ctx, eqn, invals):
    keys, values, *mask = invals
    return sc_values.sort_key_val(keys, values, mask[0] if mask else None,
                                  eqn.params["descending"])


@rule(sc_primitives.scan_count_p)
def _scan_count(ctx, eqn, invals):
    """Counts of masked-off lanes are undefined (ASSUMED, sc_values.scan_count)."""
    off = int(np.size(invals[1]) - np.count_nonzero(invals[1]))
    if off:
        ctx.call.undefined_lanes(ctx, "masked-off lanes of scan_count", off,
                                 f"{off} masked-off lanes of a scan_count are undefined")
    return sc_values.scan_count(invals[0], invals[1], ctx.fill(np.dtype(np.int32)))


@rule(sc_primitives.all_reduce_population_count_p)
def _population_count(ctx, eqn, invals):
    return sc_values.population_count(invals[0], eqn.params["reduce"])


@rule(sc_primitives.all_reduce_ffs_p)
def _first_set(ctx, eqn, invals):
    return sc_values.first_set(invals[0], eqn.params["reduce"])


@rule(sc_primitives.pack_p)
def _pack(ctx, eqn, invals):
    aval = eqn.outvars[0].aval
    return sc_values.pack(invals[0], invals[1], eqn.params["format"].value,
                          np.dtype(aval.dtype), tuple(aval.shape))


@rule(sc_primitives.unpack_p)
def _unpack(ctx, eqn, invals):
    return sc_values.unpack(invals[0], eqn.params["format"].value,
                            np.dtype(eqn.outvars[0].aval.dtype))


@rule(sc_primitives.bitcast_p)
def _bitcast(ctx, eqn, invals):
    return sc_values.bitcast(invals[0], eqn.params["dtype"])


class ParallelLoopHooks(Protocol):
    """Who follows a `parallel_loop`'s iterations (the race checker's per-iteration clocks,
    SC-C's part): registered in PARALLEL_LOOP_HOOKS; none registered, none called."""

    def loop_started(self, ctx: Any, eqn: Any) -> None: ...

    def iteration_started(self, ctx: Any, eqn: Any, index: int) -> None: ...

    def iteration_ended(self, ctx: Any, eqn: Any, index: int) -> None: ...

    def loop_ended(self, ctx: Any, eqn: Any) -> None: ...


PARALLEL_LOOP_HOOKS: list[ParallelLoopHooks] = []


@rule(sc_primitives.parallel_loop_p, generator=True, body_only=True)
def _parallel_loop(ctx, eqn, invals):
    """`parallel_loop(lower, upper, step, carry=...)`: the body per index, in order, the
    carry chaining them (the only dependence the hardware keeps between iterations; that
    the iterations are otherwise concurrent is for the hooks to model)."""
    lower, upper, step, consts, carry = eqn.params["tree"].unflatten(invals)
    lower, upper, step = int(np.asarray(lower)), int(np.asarray(upper)), int(np.asarray(step))
    if step <= 0:
        raise KernelError(f"parallel_loop with step {step}: expected a positive step",
                          current_frames(ctx))
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



# -- parallel_loop (SC-C)
