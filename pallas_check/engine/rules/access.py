"""Rules for the memory primitives of a kernel jaxpr (ref get / swap / addupdate, masked
loads and stores); the grid and control flow are control.py's.

Every memory access goes through `access_read` / `access_write`, the one place where
bounds are checked and the written-shadow is consulted and updated.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from pallas_check.jaxbridge import keys
from pallas_check.jaxbridge import params as eqn_params
from pallas_check.jaxbridge.primitives import pl_load_p, pl_swap_p, ref_addupdate_p, ref_get_p, ref_swap_p
from pallas_check.jaxbridge.types import DropVar, JaxprEqn, NDIndexer, Transform
from pallas_check.engine.jaxpr.halts import KernelError
from pallas_check.engine.jaxpr.mosaic_limits import gather_or_scatter
from pallas_check.engine.jaxpr.program import current_frames
from pallas_check.engine.jaxpr.registry import RuleFn, rule, specializer
from pallas_check.engine.memory.buffer import RefView
from pallas_check.engine.memory.region import Region, resolve
from pallas_check.engine.memory.views import UnsupportedTransform, has_array_index
from pallas_check.engine.rules import index_plan
from pallas_check.engine.seam import RunningCore
from pallas_check.findings.finding import IndexRange
from pallas_check.findings.sourceinfo import user_frames


# -- the one path for reads and writes ---------------------------------------------------

def view_of(ref: object, transforms: Sequence[Transform] | None) -> RefView:
    if not isinstance(ref, RefView):
        raise KernelError(f"expected a ref, got {type(ref).__name__}")
    return ref.with_transforms(tuple(transforms or ()))


def access_read(ctx: RunningCore, view: RefView | None, mask: np.ndarray | None = None,
                region: Region | None = None) -> np.ndarray:
    """Read through a view (or its region, already resolved): bounds-checked,
    uninitialized reads recorded."""
    if region is None:
        assert view is not None
        region = _resolve(ctx, view)
    buffer = region.buffer
    fill = ctx.fill(buffer.data.dtype)
    if region.oob:
        ctx.call.out_of_bounds(ctx, region, "load", mask)
    value = region.read(fill)
    if ctx.call.races is not None:
        if buffer.unraced and not region.post:  # one box no race can involve (unraced.py)
            ctx.call.left_out += 1
        else:
            ctx.call.access(ctx, region, False, "read")
    if not buffer.fully_written:
        written = region.read_written()
        unwritten = ~written if mask is None else (~written & np.broadcast_to(mask, written.shape))
        if unwritten.any():
            ctx.call.uninitialized_read(ctx, region, int(unwritten.sum()), unwritten)
    return value


def access_write(ctx: RunningCore, view: RefView | None, value: object, mask: np.ndarray | None = None,
                 region: Region | None = None) -> None:
    if region is None:
        assert view is not None
        region = _resolve(ctx, view, "store")
    buffer = region.buffer
    if region.zero_stride:
        raise KernelError(
            f"a store into {buffer.name} with a stride of 0 (pl.ds(start, n, 0)) writes"
            " one element n times: Pallas TPU takes stride-0 slices only in loads",
            current_frames(ctx))
    if region.oob:
        ctx.call.out_of_bounds(ctx, region, "store", mask)
    value = np.asarray(value)
    if mask is not None:
        old = region.read(ctx.fill(buffer.data.dtype))
        value = np.where(mask, value, old)
        if not region.post and region.index is not None:
            # Only the masked elements count as written.
            buf = region.buffer
            written = buf.written_at(region.index) | np.broadcast_to(mask, old.shape)
            buf.writable()[region.index] = value
            buf.mark_written(region.index, written)
            ctx.call.on_write(ctx, region)
            return
    region.write(value, ctx.fill(buffer.data.dtype), touched=mask)
    if ctx.call.races is not None:  # (`ctx.call.on_write(ctx, region)`, inlined)
        if buffer.unraced and not region.post:  # one box no race can involve (unraced.py)
            ctx.call.left_out += 1
        else:
            ctx.call.access(ctx, region, True, "write")


def access_atomic_add(ctx: RunningCore, view: RefView | None, value: object, operation: str,
                      region: Region | None = None) -> None:
    """ref += value as ONE atomic read-modify-write (SparseCore `addupdate`,
    `addupdate_scatter`: "an atomic add", jax/_src/pallas/mosaic/sc_primitives.py): bounds
    and never-written elements checked as a read and a write are, but the race checker
    sees a single atomic-add access, which never races with another atomic add (parallel
    loop iterations or subcores adding into one histogram), only with plain reads and
    writes it is not ordered with."""
    if region is None:
        assert view is not None
        region = _resolve(ctx, view, "store")
    buffer = region.buffer
    fill = ctx.fill(buffer.data.dtype)
    if region.oob:
        ctx.call.out_of_bounds(ctx, region, operation, None)
    old = np.asarray(region.read(fill))
    if not buffer.fully_written:
        unwritten = ~region.read_written()
        if unwritten.any():
            ctx.call.uninitialized_read(ctx, region, int(unwritten.sum()), unwritten)
    region.write(old + np.asarray(value).astype(old.dtype), fill)
    if ctx.call.races is not None:
        ctx.call.access(ctx, region, True, operation, atomic_add=True)


def _resolve(ctx: RunningCore, view: RefView, operation: str = "load") -> Region:
    try:
        region = resolve(view)
    except UnsupportedTransform as exc:
        raise KernelError(f"unsupported ref transform: {exc}", current_frames(ctx))
    # An indexer with an array of indices is left for after the plain ones (`post`).
    if region.post and any(isinstance(t, NDIndexer)
                           and has_array_index(t) for t in region.post):
        # Found before the call ran (engine/jaxpr/mosaic_limits.py) unless spelled otherwise: the
        # kernel's defect either way, and the call is skipped.
        raise gather_or_scatter(view.buffer.name, view.buffer.space, operation,
                                current_frames(ctx))
    return region


def _cast(value: np.ndarray, aval: object) -> np.ndarray:
    dtype = keys.held_dtype(getattr(aval, "dtype", None))  # a key's words (jaxbridge/keys.py)
    if dtype is not None and value.dtype != dtype:
        value = value.astype(dtype)
    return value


# -- state primitives ----------------------------------------------------------------------

def _region_of(ctx: RunningCore, eqn: JaxprEqn, ref: object, flat: list[object]) -> Region:
    """The region a `ref[indices]` access touches (resolved once per call for the same
    equation, index values and buffer; for a ref with no transforms of its own, once for
    every buffer of its shape and memory space: 32 SparseCore subcores each reading their
    own VMEM scratch at the same indices share one entry, where an entry per buffer
    overflowed the cache, which then resolved more than half the accesses anew, issue
    54.7)."""
    if ref.__class__ is RefView and not ref.transforms:
        buffer = ref.buffer
        shared = ctx.call.accesses.get_or_make_plain(
            eqn, [(buffer.data.shape, buffer.space), *flat],
            lambda: _region_made(ctx, eqn, ref, flat))
        return shared.of(buffer)
    return ctx.call.accesses.get_or_make(eqn, [ref, *flat],
                                         lambda: _region_made(ctx, eqn, ref, flat))


def _region_made(ctx: RunningCore, eqn: JaxprEqn, ref: object, flat: list[object]) -> Region:
    """A `ref[indices]` region: through the index plan of the equation's indexers, or the
    general way when the plan does not cover them."""
    tree = eqn_params.operand_tree(eqn)
    plan = index_plan.plan_for(tree)
    if plan is not None and plan.ref is None:
        try:
            region = plan.region(flat, ref)
        except UnsupportedTransform as exc:
            raise KernelError(f"unsupported ref transform: {exc}", current_frames(ctx))
        if region is not None:
            return region
    return _resolve(ctx, view_of(ref, tree.unflatten(flat)),
                    "load" if eqn.primitive is ref_get_p else "store")


@rule(ref_get_p)
def _get(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> object:
    ref, *flat = invals
    region = _region_of(ctx, eqn, ref, flat)
    return _cast(access_read(ctx, None, region=region), eqn.outvars[0].aval)


@specializer(ref_get_p)
def _scalar_get(eqn: JaxprEqn) -> RuleFn | None:
    """A load of one element by scalar indices (`lengths_ref[b]`, a page table's entry; a
    paged kernel makes thousands per call): read straight from the buffer, at the index
    its plan's straight-line code gives, when it is plain, in bounds and written
    everywhere; a race checker is handed the element's box, with no region made for it
    (races on, such reads are most of a paged kernel's accesses). Another scalar load
    takes `_get`, any other load `_held_get`."""
    out = eqn.outvars[0].aval  # (a ShapedArray: a get's value)
    if getattr(out, "shape", None) != ():
        return _held_get(eqn)
    plan = index_plan.plan_for(eqn_params.operand_tree(eqn))
    if plan is None or plan.ref is not None or len(plan.steps) != 1 or any(
            size is not None for _, _, size, _ in plan.steps[0]):
        return _held_get(eqn)
    index_in_bounds = plan.index_in_bounds  # of the leaves after the ref
    dtype = np.dtype(keys.held_dtype(getattr(out, "dtype")))
    # The equation's own frames, found once (a race checker is handed them at every load;
    # none: the enclosing equation's, found at the load).
    own_frames = user_frames(eqn.source_info)

    def scalar_get(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> object:
        ref = invals[0]
        if ref.__class__ is RefView and not ref.transforms:
            buffer = ref.buffer
            if buffer.fully_written and buffer.data.dtype == dtype:
                index = index_in_bounds(invals[1:], buffer)
                if index is not None:
                    if ctx.call.races is None:
                        pass
                    elif buffer.unraced:  # nothing writes it (engine/call/unraced.py)
                        ctx.call.left_out += 1  # (`left_out_one`, inlined)
                    else:  # all ints: the index is the element's
                        ctx.call.access_box(
                            ctx, buffer, _element_box(index),  # type: ignore[arg-type]
                            False, "read", own_frames or current_frames(ctx))
                    return buffer.data[index]
        return _get(ctx, eqn, invals)

    return scalar_get


def _element_box(index: tuple[int, ...]) -> IndexRange:
    """The box of one element (a list, not a generator: this runs at every scalar load)."""
    if len(index) == 1:
        i = index[0]
        return ((i, i + 1),)
    return tuple([(i, i + 1) for i in index])


def _held_get(eqn: JaxprEqn) -> RuleFn:
    """`_get` with the dtype its value is held in found once for the equation (a
    SparseCore kernel reads tens of thousands of (L,)-vectors per call)."""
    dtype = keys.held_dtype(getattr(eqn.outvars[0].aval, "dtype", None))

    def held_get(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> object:
        ref, *flat = invals
        value = access_read(ctx, None, region=_region_of(ctx, eqn, ref, flat))
        if dtype is not None and value.dtype != dtype:
            value = value.astype(dtype)
        return value

    return held_get


@rule(ref_swap_p)
def _swap(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> object:
    ref, value, *flat = invals
    region = _region_of(ctx, eqn, ref, flat)
    old = None
    if not _is_drop(eqn.outvars[0]):
        old = region.read(ctx.fill(region.buffer.data.dtype))
    access_write(ctx, None, value, region=region)
    return old  # None for a dropped result: nothing is bound


@rule(ref_addupdate_p)
def _addupdate(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> object:
    ref, value, *flat = invals
    view = view_of(ref, eqn_params.operand_tree(eqn).unflatten(flat))
    old = access_read(ctx, view)
    access_write(ctx, view, old + np.asarray(value, dtype=old.dtype))
    return []


def _is_drop(v: object) -> bool:
    return isinstance(v, DropVar)


def _peek(ctx: RunningCore, view: RefView) -> np.ndarray:
    """The old value a swap returns (its uninitialized-ness does not matter unless used)."""
    region = _resolve(ctx, view)
    return region.read(ctx.fill(view.buffer.data.dtype))


@rule(pl_load_p)
def _masked_load(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> object:
    ref, transforms, mask, other = eqn_params.args_tree(eqn).unflatten(invals)
    view = view_of(ref, transforms)
    mask_np = None if mask is None else np.asarray(mask, dtype=bool)
    value = access_read(ctx, view, mask_np)
    if mask_np is not None:
        alt = ctx.fill(value.dtype) if other is None else np.asarray(other, dtype=value.dtype)
        value = np.where(mask_np, value, alt)
    return _cast(value, eqn.outvars[0].aval)


@rule(pl_swap_p)
def _masked_swap(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> object:
    ref, transforms, value, mask = eqn_params.args_tree(eqn).unflatten(invals)
    view = view_of(ref, transforms)
    old = None if _is_drop(eqn.outvars[0]) else _peek(ctx, view)
    mask_np = None if mask is None else np.asarray(mask, dtype=bool)
    access_write(ctx, view, value, mask_np)
    return old  # None for a dropped result: nothing is bound
