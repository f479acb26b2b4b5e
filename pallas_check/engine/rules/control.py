"""Rules for the grid, control-flow and device primitives of a kernel jaxpr: program ids,
jit / cond / while / scan bodies evaluated by our evaluator (so that their ref accesses go
through our rules), scoped allocations, custom derivatives and the axis index (the PRNG's
are in random.py).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from pallas_check.jaxbridge import params as eqn_params
from pallas_check.jaxbridge.jaxprs import arg_names
from pallas_check.jaxbridge.primitives import (axis_index_p, closed_call_p, cond_p,
                                               custom_call_primitives, delay_p, jit_p,
                                               multiple_of_p, num_programs_p,
                                               program_id_p,
                                               run_scoped_p, scan_p, touch_p, trace_value_p,
                                               while_p)
from pallas_check.jaxbridge.types import ClosedJaxpr, JaxprEqn
from pallas_check.engine.jaxpr.program import Gen, eval_closed, eval_jaxpr, runner_for
from pallas_check.engine.jaxpr.avals import array_aval
from pallas_check.engine.jaxpr.registry import RuleFn, RuleGen, rule, specializer
from pallas_check.engine.seam import RunningCore


# -- grid ------------------------------------------------------------------------------------

@rule(program_id_p)
def _program_id(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> object:
    return np.int32(ctx.program_id(eqn_params.grid_axis(eqn)))


@specializer(program_id_p)
def _program_id_for(eqn: JaxprEqn) -> RuleFn:
    """`_program_id` with its axis read once (a kernel asks at every grid step)."""
    axis = eqn_params.grid_axis(eqn)

    def program_id(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> object:
        return np.int32(ctx.program_id(axis))

    return program_id


@rule(num_programs_p)
def _num_programs(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> object:
    return np.int32(ctx.num_programs(eqn_params.grid_axis(eqn)))


@rule(multiple_of_p)
def _multiple_of(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> object:
    return invals[0]


# -- no-ops and hints --------------------------------------------------------------------------

@rule(delay_p, touch_p, trace_value_p)
def _no_op(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> object:
    return [] if eqn.primitive.multiple_results else None


# -- control flow ------------------------------------------------------------------------------

@rule(jit_p, generator=True, body_only=True)
def _jit(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> RuleGen:
    return (yield from eval_closed(ctx, eqn_params.body(eqn), invals))


@rule(closed_call_p, generator=True, body_only=True)
def _closed_call(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> RuleGen:
    return (yield from eval_closed(ctx, eqn_params.call_body(eqn), invals))


@rule(cond_p, generator=True, body_only=True)
def _cond(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> RuleGen:
    """The rule as registered; a generated program uses `_cond_for`'s, made per equation."""
    return (yield from _cond_for(eqn)(ctx, eqn, invals))


@rule(while_p, generator=True, body_only=True)
def _while(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> RuleGen:
    """The rule as registered; a generated program uses `_while_for`'s."""
    return (yield from _while_for(eqn)(ctx, eqn, invals))


# A rule made for one equation, a generator (cond, while).
_GenRule = Callable[[RunningCore, JaxprEqn, list[object]], RuleGen]


def _runners(closed: Sequence[ClosedJaxpr]
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


@specializer(cond_p)
def _cond_for(eqn: JaxprEqn) -> _GenRule:
    """`_cond` with its branches' functions kept (a kernel body's conds run at every grid
    step: looking their programs up again cost more than the branch)."""
    branches = eqn_params.branches(eqn)
    last = len(branches) - 1
    runner = _runners(branches)

    def cond(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> RuleGen:
        # The branch index (an integer scalar, numpy's or JAX's), clamped as lax.switch does.
        i = min(max(int(invals[0]), 0), last)  # type: ignore[call-overload]  # (no cast call: per step)
        return (yield from runner(ctx, i)(ctx, branches[i].consts, invals[1:]))

    return cond


@specializer(while_p)
def _while_for(eqn: JaxprEqn) -> _GenRule:
    """`_while` with its cond and body functions kept."""
    loop = eqn_params.while_loop(eqn)
    n_cond, n_body = loop.cond_nconsts, loop.body_nconsts
    cond_closed, body_closed = loop.cond, loop.body
    runner = _runners([cond_closed, body_closed])

    def while_loop(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> RuleGen:
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


@rule(scan_p, generator=True, body_only=True)
def _scan(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> RuleGen:
    p = eqn_params.scan_loop(eqn)
    num_consts, num_carry, length = p.num_consts, p.num_carry, p.length
    consts = invals[:num_consts]
    carry = list(invals[num_consts: num_consts + num_carry])
    xs = [np.asarray(x) for x in invals[num_consts + num_carry:]]
    ys_per_step: list[list[object]] = []
    order = range(length - 1, -1, -1) if p.reverse else range(length)
    for i in order:
        outs = yield from eval_closed(ctx, p.body, [*consts, *carry, *[x[i] for x in xs]])
        carry = list(outs[:num_carry])
        ys_per_step.append(list(outs[num_carry:]))
    if p.reverse:
        ys_per_step.reverse()
    y_avals = [array_aval(v) for v in eqn.outvars[num_carry:]]
    ys: list[np.ndarray] = []
    for j, aval in enumerate(y_avals):
        if length == 0:
            ys.append(np.zeros(aval.shape, aval.dtype))
        else:
            ys.append(np.stack([np.asarray(step[j]) for step in ys_per_step]).astype(aval.dtype))
    return [*carry, *ys]


@rule(run_scoped_p, generator=True)
def _run_scoped(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> RuleGen:
    body = eqn_params.body(eqn)
    names = arg_names(body, "scoped[{}]")
    refs = [ctx.call.allocate_scoped(ctx, var.aval, name, (id(eqn), position))
            for position, (var, name) in enumerate(zip(body.invars, names))]
    try:
        outs = yield from eval_jaxpr(ctx, body, invals, refs)
    finally:
        ctx.call.release_scoped(ctx, refs)
    return outs


def _register_custom_calls() -> None:
    """custom_jvp / custom_vjp calls inside a kernel evaluate their primal function."""
    if not custom_call_primitives:  # pragma: no cover - layout of another JAX version
        return

    def _custom(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> RuleGen:
        return (yield from eval_closed(ctx, eqn_params.primal_jaxpr(eqn), invals))

    rule(*custom_call_primitives, generator=True, body_only=True)(_custom)


_register_custom_calls()


# -- devices ----------------------------------------------------------------------------------

@rule(axis_index_p)
def _axis_index(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> object:
    return np.int32(ctx.axis_index(eqn_params.axis_name(eqn)))

