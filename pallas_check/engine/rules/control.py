"""Rules for the grid, control-flow, device and PRNG primitives of a kernel jaxpr: program
ids, jit / cond / while / scan bodies evaluated by our evaluator (so that their ref
accesses go through our rules), scoped allocations, custom derivatives, the axis index and
the TPU's stateful PRNG.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
from jax.extend.core import JaxprEqn
from pallas_check.jaxbridge import jax_core
from pallas_check.jaxbridge import custom_derivatives
from pallas_check.jaxbridge import lax_control_flow
from pallas_check.jaxbridge import pallas_primitives
from pallas_check.jaxbridge import mosaic_primitives
from pallas_check.jaxbridge import pjit
from pallas_check.jaxbridge import lax_parallel

from pallas_check.engine.jaxpr.program import Gen, eval_closed, eval_jaxpr, runner_for
from pallas_check.engine.jaxpr.registry import RuleFn, rule, specializer
from pallas_check.engine.seam import RunningCore


# -- grid ------------------------------------------------------------------------------------

@rule(pallas_primitives.program_id_p)
def _program_id(ctx, eqn, invals):
    return np.int32(ctx.program_id(eqn.params["axis"]))


@rule(pallas_primitives.num_programs_p)
def _num_programs(ctx, eqn, invals):
    return np.int32(ctx.num_programs(eqn.params["axis"]))


@rule(pallas_primitives.multiple_of_p)
def _multiple_of(ctx, eqn, invals):
    return invals[0]


# -- no-ops and hints --------------------------------------------------------------------------

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


def _runners(closed: Sequence[jax_core.ClosedJaxpr]
             ) -> Callable[[RunningCore, int], Callable[..., Gen]]:
    """Per float-skipping setting, the generated functions of some sub-jaxprs, each made
    at its first use (a branch never taken is never generated)."""
    made: dict[bool, list[Callable[..., Gen] | None]] = {}

    def runner(ctx: RunningCore, k: int) -> Callable[..., Gen]:
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
def _cond_for(eqn: JaxprEqn) -> RuleFn | None:
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
def _while_for(eqn: JaxprEqn) -> RuleFn | None:
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


def _arg_names(jaxpr: object, n: int, prefix: str) -> list[str]:
    info = getattr(jaxpr, "debug_info", None)
    names = list(getattr(info, "arg_names", None) or ())
    out = []
    for i in range(n):
        name = names[i] if i < len(names) and names[i] else f"{prefix}[{i}]"
        out.append(name)
    return out


def _register_custom_calls() -> None:
    """custom_jvp / custom_vjp calls inside a kernel evaluate their primal function."""
    cd = custom_derivatives()
    if cd is None:  # pragma: no cover - layout of another JAX version
        return

    def _custom(ctx, eqn, invals):
        closed = eqn.params.get("call_jaxpr") or eqn.params.get("fun_jaxpr")
        return (yield from eval_closed(ctx, closed, invals))

    prims = [getattr(cd, n) for n in ("custom_jvp_call_p", "custom_vjp_call_p") if hasattr(cd, n)]
    rule(*prims, generator=True, body_only=True)(_custom)


_register_custom_calls()


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
