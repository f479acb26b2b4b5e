"""Rules for the memory, grid and control-flow primitives of a kernel jaxpr.

Every memory access goes through `access_read` / `access_write`, the one place where
bounds are checked and the written-shadow is consulted and updated.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from pallas_check.jaxbridge import jax_core
from pallas_check.jaxbridge import lax_control_flow
from pallas_check.jaxbridge import lax_internal
from pallas_check.jaxbridge import pallas_primitives
from pallas_check.jaxbridge import mosaic_primitives
from pallas_check.jaxbridge import state_indexing
from pallas_check.jaxbridge import state_primitives
from pallas_check.jaxbridge import pjit
from pallas_check.jaxbridge import lax_parallel

from pallas_check.engine import index_plan, memory
from pallas_check.engine.evaluate import (
    KernelError,
    current_frames,
    eval_closed,
    eval_jaxpr,
    rule,
    runner_for,
    specializer,
)
from pallas_check.engine.memory import RefView, Region
from pallas_check.engine.mosaic_limits import gather_or_scatter


# -- the one path for reads and writes ---------------------------------------------------

def view_of(ref: Any, transforms: Any) -> RefView:
    if not isinstance(ref, RefView):
        raise KernelError(f"expected a ref, got {type(ref).__name__}")
    return ref.with_transforms(tuple(transforms or ()))


def access_read(ctx: Any, view: RefView | None, mask: np.ndarray | None = None,
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
        ctx.call.access(ctx, region, False, "read")
    if not buffer.fully_written:
        written = region.read_written()
        unwritten = ~written if mask is None else (~written & np.broadcast_to(mask, written.shape))
        if unwritten.any():
            ctx.call.uninitialized_read(ctx, region, int(unwritten.sum()), unwritten)
    return value


def access_write(ctx: Any, view: RefView | None, value: Any, mask: np.ndarray | None = None,
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
    ctx.call.on_write(ctx, region)


def _resolve(ctx: Any, view: RefView, operation: str = "load") -> Region:
    try:
        region = memory.resolve(view)
    except memory.UnsupportedTransform as exc:
        raise KernelError(f"unsupported ref transform: {exc}", current_frames(ctx))
    # An indexer with an array of indices is left for after the plain ones (`post`).
    if region.post and any(isinstance(t, state_indexing.NDIndexer)
                           and memory.has_array_index(t) for t in region.post):
        # Found before the call ran (engine/mosaic_limits.py) unless spelled otherwise: the
        # kernel's defect either way, and the call is skipped.
        raise gather_or_scatter(view.buffer.name, view.buffer.space, operation,
                                current_frames(ctx))
    return region


def _cast(value: np.ndarray, aval: Any) -> np.ndarray:
    dtype = getattr(aval, "dtype", None)
    if dtype is not None and value.dtype != dtype:
        value = value.astype(dtype)
    return value


# -- state primitives ----------------------------------------------------------------------

def _region_of(ctx: Any, eqn: Any, ref: Any, flat: list) -> Region:
    """The region a `ref[indices]` access touches (resolved once per call for the same
    equation, ref and index values)."""
    return ctx.call.accesses.get_or_make(eqn, [ref, *flat],
                                         lambda: _region_made(ctx, eqn, ref, flat))


def _region_made(ctx: Any, eqn: Any, ref: Any, flat: list) -> Region:
    """A `ref[indices]` region: through the index plan of the equation's indexers, or the
    general way when the plan does not cover them."""
    tree = eqn.params["tree"]
    plan = index_plan.plan_for(tree)
    if plan is not None and plan.ref is None:
        try:
            region = plan.region(flat, ref)
        except memory.UnsupportedTransform as exc:
            raise KernelError(f"unsupported ref transform: {exc}", current_frames(ctx))
        if region is not None:
            return region
    return _resolve(ctx, view_of(ref, tree.unflatten(flat)),
                    "load" if eqn.primitive is state_primitives.get_p else "store")


@rule(state_primitives.get_p)
def _get(ctx, eqn, invals):
    ref, *flat = invals
    region = _region_of(ctx, eqn, ref, flat)
    return _cast(access_read(ctx, None, region=region), eqn.outvars[0].aval)


@specializer(state_primitives.get_p)
def _scalar_get(eqn: Any) -> Any:
    """A load of one element by scalar indices (`lengths_ref[b]`, a page table's entry; a
    paged kernel makes thousands per call): read straight from the buffer, at the index
    its plan's straight-line code gives, when it is plain, in bounds, written everywhere
    and no race checker records reads; anything else takes `_get`."""
    if eqn.outvars[0].aval.shape != ():
        return None
    plan = index_plan.plan_for(eqn.params["tree"])
    if plan is None or plan.ref is not None or len(plan.steps) != 1 or any(
            size is not None for _, _, size, _ in plan.steps[0]):
        return None
    index_in_bounds = plan.index_in_bounds  # of the leaves after the ref
    dtype = np.dtype(eqn.outvars[0].aval.dtype)

    def scalar_get(ctx: Any, eqn: Any, invals: list) -> Any:
        ref = invals[0]
        if ref.__class__ is RefView and not ref.transforms and ctx.call.races is None:
            buffer = ref.buffer
            if buffer.fully_written and buffer.data.dtype == dtype:
                index = index_in_bounds(invals[1:], buffer)
                if index is not None:
                    return buffer.data[index]
        return _get(ctx, eqn, invals)

    return scalar_get


@rule(state_primitives.swap_p)
def _swap(ctx, eqn, invals):
    ref, value, *flat = invals
    region = _region_of(ctx, eqn, ref, flat)
    old = None
    if not _is_drop(eqn.outvars[0]):
        old = region.read(ctx.fill(region.buffer.data.dtype))
    access_write(ctx, None, value, region=region)
    return old  # None for a dropped result: nothing is bound


@rule(state_primitives.addupdate_p)
def _addupdate(ctx, eqn, invals):
    ref, value, *flat = invals
    view = view_of(ref, eqn.params["tree"].unflatten(flat))
    old = access_read(ctx, view)
    access_write(ctx, view, old + np.asarray(value, dtype=old.dtype))
    return []


def _is_drop(v: Any) -> bool:
    return isinstance(v, jax_core.DropVar)


def _peek(ctx: Any, view: RefView) -> np.ndarray:
    """The old value a swap returns (its uninitialized-ness does not matter unless used)."""
    region = _resolve(ctx, view)
    return region.read(ctx.fill(view.buffer.data.dtype))


@rule(pallas_primitives.load_p)
def _masked_load(ctx, eqn, invals):
    ref, transforms, mask, other = eqn.params["args_tree"].unflatten(invals)
    view = view_of(ref, transforms)
    mask_np = None if mask is None else np.asarray(mask, dtype=bool)
    value = access_read(ctx, view, mask_np)
    if mask_np is not None:
        alt = ctx.fill(value.dtype) if other is None else np.asarray(other, dtype=value.dtype)
        value = np.where(mask_np, value, alt)
    return _cast(value, eqn.outvars[0].aval)


@rule(pallas_primitives.swap_p)
def _masked_swap(ctx, eqn, invals):
    ref, transforms, value, mask = eqn.params["args_tree"].unflatten(invals)
    view = view_of(ref, transforms)
    old = None if _is_drop(eqn.outvars[0]) else _peek(ctx, view)
    mask_np = None if mask is None else np.asarray(mask, dtype=bool)
    access_write(ctx, view, value, mask_np)
    return old  # None for a dropped result: nothing is bound


# -- grid ------------------------------------------------------------------------------------

@rule(pallas_primitives.program_id_p)
def _program_id(ctx, eqn, invals):
    return np.int32(ctx.program_id(eqn.params["axis"]))


@rule(pallas_primitives.num_programs_p)
def _num_programs(ctx, eqn, invals):
    return np.int32(ctx.num_programs(eqn.params["axis"]))


# -- no-ops and hints --------------------------------------------------------------------------

@rule(pallas_primitives.multiple_of_p)
def _multiple_of(ctx, eqn, invals):
    return invals[0]


@rule(pallas_primitives.delay_p, mosaic_primitives.touch_p, mosaic_primitives.trace_value_p)
def _no_op(ctx, eqn, invals):
    return [] if eqn.primitive.multiple_results else None


# -- control flow ------------------------------------------------------------------------------

@rule(pjit.jit_p, generator=True, body_only=True)
def _jit(ctx, eqn, invals):
    return (yield from eval_closed(ctx, eqn.params["jaxpr"], invals))


@rule(jax_core.closed_call_p, generator=True, body_only=True)
def _closed_call(ctx, eqn, invals):
    return (yield from eval_closed(ctx, eqn.params["call_jaxpr"], invals))


@rule(lax_control_flow.cond_p, generator=True, body_only=True)
def _cond(ctx, eqn, invals):
    """The rule as registered; a generated program uses `_cond_for`'s, made per equation."""
    return (yield from _cond_for(eqn)(ctx, eqn, invals))


@rule(lax_control_flow.while_p, generator=True, body_only=True)
def _while(ctx, eqn, invals):
    """The rule as registered; a generated program uses `_while_for`'s."""
    return (yield from _while_for(eqn)(ctx, eqn, invals))


def _runners(closed: Sequence[jax_core.ClosedJaxpr]) -> Any:
    """Per float-skipping setting, the generated functions of some sub-jaxprs, each made
    at its first use (a branch never taken is never generated)."""
    made: dict[bool, list] = {}

    def runner(ctx: Any, k: int) -> Any:
        skip = ctx.config.skip_floats
        runs = made.get(skip)
        if runs is None:
            runs = made[skip] = [None] * len(closed)
        run = runs[k]
        if run is None:
            run = runs[k] = runner_for(closed[k].jaxpr, skip)
        return run

    return runner


@specializer(lax_control_flow.cond_p)
def _cond_for(eqn: Any) -> Any:
    """`_cond` with its branches' functions kept (a kernel body's conds run at every grid
    step: looking their programs up again cost more than the branch)."""
    branches = eqn.params["branches"]
    last = len(branches) - 1
    runner = _runners(branches)

    def cond(ctx, eqn, invals):
        i = min(max(int(invals[0]), 0), last)  # clamped, as lax.switch does
        return (yield from runner(ctx, i)(ctx, branches[i].consts, invals[1:]))

    return cond


@specializer(lax_control_flow.while_p)
def _while_for(eqn: Any) -> Any:
    """`_while` with its cond and body functions kept."""
    p = eqn.params
    n_cond, n_body = p["cond_nconsts"], p["body_nconsts"]
    cond_closed, body_closed = p["cond_jaxpr"], p["body_jaxpr"]
    runner = _runners([cond_closed, body_closed])

    def while_loop(ctx, eqn, invals):
        run_cond, run_body = runner(ctx, 0), runner(ctx, 1)
        cond_consts = invals[:n_cond]
        body_consts = invals[n_cond:n_cond + n_body]
        carry = list(invals[n_cond + n_body:])
        while True:
            (keep_going,) = yield from run_cond(ctx, cond_closed.consts, [*cond_consts, *carry])
            if not bool(np.asarray(keep_going)):
                return carry
            carry = list((yield from run_body(ctx, body_closed.consts, [*body_consts, *carry])))

    return while_loop


@rule(lax_control_flow.scan_p, generator=True, body_only=True)
def _scan(ctx, eqn, invals):
    p = eqn.params
    num_consts, num_carry, length = p["num_consts"], p["num_carry"], p["length"]
    consts = invals[:num_consts]
    carry = list(invals[num_consts: num_consts + num_carry])
    xs = [np.asarray(x) for x in invals[num_consts + num_carry:]]
    ys_per_step: list[list[Any]] = []
    order = range(length - 1, -1, -1) if p["reverse"] else range(length)
    for i in order:
        outs = yield from eval_closed(ctx, p["jaxpr"], [*consts, *carry, *[x[i] for x in xs]])
        carry = list(outs[:num_carry])
        ys_per_step.append(list(outs[num_carry:]))
    if p["reverse"]:
        ys_per_step.reverse()
    y_avals = [v.aval for v in eqn.outvars[num_carry:]]
    ys = []
    for j, aval in enumerate(y_avals):
        if length == 0:
            ys.append(np.zeros(aval.shape, aval.dtype))
        else:
            ys.append(np.stack([np.asarray(step[j]) for step in ys_per_step]).astype(aval.dtype))
    return [*carry, *ys]


@rule(pallas_primitives.run_scoped_p, generator=True)
def _run_scoped(ctx, eqn, invals):
    body = eqn.params["jaxpr"]
    names = _arg_names(body, len(body.invars), prefix="scoped")
    refs = [ctx.call.allocate_scoped(ctx, var.aval, name, (id(eqn), position))
            for position, (var, name) in enumerate(zip(body.invars, names))]
    try:
        outs = yield from eval_jaxpr(ctx, body, invals, refs)
    finally:
        ctx.call.release_scoped(ctx, refs)
    return outs


def _arg_names(jaxpr: Any, n: int, prefix: str) -> list[str]:
    info = getattr(jaxpr, "debug_info", None)
    names = list(getattr(info, "arg_names", None) or ())
    out = []
    for i in range(n):
        name = names[i] if i < len(names) and names[i] else f"{prefix}[{i}]"
        out.append(name)
    return out


def _register_custom_calls() -> None:
    """custom_jvp / custom_vjp calls inside a kernel evaluate their primal function."""
    from pallas_check.jaxbridge import custom_derivatives

    cd = custom_derivatives()
    if cd is None:  # pragma: no cover - layout of another JAX version
        return

    def _custom(ctx, eqn, invals):
        closed = eqn.params.get("call_jaxpr") or eqn.params.get("fun_jaxpr")
        return (yield from eval_closed(ctx, closed, invals))

    prims = [getattr(cd, n) for n in ("custom_jvp_call_p", "custom_vjp_call_p") if hasattr(cd, n)]
    rule(*prims, generator=True, body_only=True)(_custom)


_register_custom_calls()

# Keep an explicit reference so linters see lax_internal is used for dtype helpers.
_ = lax_internal


# -- devices ----------------------------------------------------------------------------------

@rule(lax_parallel.axis_index_p)
def _axis_index(ctx, eqn, invals):
    return np.int32(ctx.axis_index(eqn.params["axis_name"]))


# -- the TPU's stateful PRNG ---------------------------------------------------------------

@rule(mosaic_primitives.prng_seed_p)
def _prng_seed(ctx, eqn, invals):
    seeds = [int(np.asarray(s).astype(np.int64)) & 0xFFFFFFFF for s in invals]
    ctx.rng = np.random.default_rng(seeds or [0])
    return []


@rule(mosaic_primitives.prng_random_bits_p)
def _prng_random_bits(ctx, eqn, invals):
    shape = tuple(eqn.params["shape"])
    bits = ctx.rng.integers(0, 2**32, size=shape, dtype=np.uint64).astype(np.uint32)
    return bits.view(np.int32)
