"""A kernel jaxpr traced into the compiled call, equation by equation.

Pure equations are bound as they are (their CPU lowering is XLA's). The equations whose
meaning is the TPU's act on the `Machine`: loads and stores, DMAs and semaphores, the
grid queries, scoped allocations; control flow carries the machine through `lax.switch`,
`lax.while_loop` and `lax.scan`. Anything else that touches a ref, another device or a
core, prints or asserts raises `Unsupported`, and the call runs on the engine.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax

from pallas_check.compiled.boxes import Index
from pallas_check.compiled.jaxpr_facts import eqn_writes, unread_variables
from pallas_check.compiled.machine import Machine
from pallas_check.compiled.refs import BufferInfo, Carry, Ref, Unsupported
from pallas_check.compiled.verdict import Verdict
from pallas_check.engine.jaxpr.avals import aval_dtype
from pallas_check.engine.rules import conversions
from pallas_check.jaxbridge import params as eqn_params
from pallas_check.jaxbridge import primitives as prims
from pallas_check.jaxbridge.jaxprs import (barrier_semaphore_dtype, regular_semaphore_dtype,
                                             semaphore_dtype, value_aval)
from pallas_check.jaxbridge.types import (Atom, ClosedJaxpr, DropVar, Jaxpr, JaxprEqn, Literal,
                                          TransformedRef, Var)

# Primitives of the TPU's own that the compiled tier leaves to the engine, by name
# (in nested jaxprs too): prints and checks, other devices and cores, the PRNG and typed
# keys (`random_bits`, `random_fold_in`, ...), SparseCore.
_ENGINE_WORDS = ("print", "callback", "check", "barrier", "device_id", "axis_index",
                 "core", "prng", "random_", "delay", "remote", "touch", "trace_value")
# SparseCore's vector primitives (some share a name with lax's gather and scatter).
_SPARSECORE = frozenset(getattr(prims, n) for n in dir(prims) if n.startswith("sc_"))
# The explicit MXU operations: state of a core's own (staging registers, accumulators),
# which the engine keeps (engine/rules/mxu.py).
_MXU = frozenset((prims.matmul_push_rhs_p, prims.matmul_acc_lhs_p, prims.matmul_pop_p))

# An equation's operands or results while tracing: traced arrays, `Ref`s, literals, None.
Values = list[Any]
# A loop's or branch's carry: the machine's, and the jaxpr's own values.
LoopCarry = tuple[Carry, Values]
Rule = Callable[["Evaluator", JaxprEqn, Values], Values]
RULES: dict[object, Rule] = {}


def rule(*primitives: object) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        for p in primitives:
            if p is not None:
                RULES[p] = fn
        return fn
    return register


class Evaluator:
    """Evaluates jaxprs on one machine at one grid point (`point`: the program ids)."""

    def __init__(self, machine: Machine, point: Sequence[Index], grid: Sequence[int]) -> None:
        self.machine, self.point, self.grid = machine, list(point), list(grid)
        # The variables nothing reads in the jaxpr whose equation is being evaluated (a
        # swap's old value there is not read: `_swap`).
        self.unread: frozenset[Var] = frozenset()

    def run(self, jaxpr: Jaxpr, consts: Sequence[object], args: Sequence[object]) -> Values:
        env: dict[Any, Any] = {}

        def read(atom: Atom) -> Any:
            return atom.val if isinstance(atom, Literal) else env[atom]

        env.update(zip(jaxpr.constvars, consts))
        env.update(zip(jaxpr.invars, args))
        unread = unread_variables(jaxpr)
        for eqn in jaxpr.eqns:
            invals = [read(v) for v in eqn.invars]
            self.unread = unread  # (again at each equation: a nested jaxpr's run sets it)
            found = RULES.get(eqn.primitive)
            outs = found(self, eqn, invals) if found is not None else self._pure(eqn, invals)
            for var, value in zip(eqn.outvars, outs):
                if not isinstance(var, DropVar):
                    env[var] = value
        return [read(v) for v in jaxpr.outvars]

    def _pure(self, eqn: JaxprEqn, invals: Values) -> Values:
        name = eqn.primitive.name
        if eqn.primitive in _MXU:
            raise Unsupported(f"an explicit MXU operation (`{name}`)")
        if eqn.primitive in _SPARSECORE or any(word in name for word in _ENGINE_WORDS):
            raise Unsupported(f"`{name}`")
        if any(isinstance(v, (Ref, TransformedRef)) for v in invals):
            raise Unsupported(f"`{name}` on a ref")
        out = eqn.primitive.bind(*invals, **eqn_params.bind_params(eqn))
        return list(out) if eqn.primitive.multiple_results else [out]


def resolve(ref: Any, transforms: Sequence[Any] = ()) -> Ref:
    """A ref and its transforms as one `Ref` (indexers only)."""
    if isinstance(ref, TransformedRef):
        return resolve(ref.ref, (*ref.transforms, *transforms))
    if not isinstance(ref, Ref):
        raise Unsupported("a ref the compiled tier did not make")
    for transform in transforms:
        if not hasattr(transform, "indices"):
            raise Unsupported(f"a ref transform ({type(transform).__name__})")
        ref = ref.indexed(transform)
    return ref


def _cast(value: jax.Array, aval: Any) -> jax.Array:
    dtype = getattr(aval, "dtype", None)
    return value if dtype is None or value.dtype == dtype else value.astype(dtype)


# -- loads and stores ----------------------------------------------------------------------

@rule(prims.ref_get_p)
def _get(ev: Evaluator, eqn: JaxprEqn, invals: Values) -> Values:
    ref = resolve(invals[0], eqn_params.operand_tree(eqn).unflatten(invals[1:]))
    return [_cast(ev.machine.read(ref), eqn.outvars[0].aval)]


@rule(prims.ref_swap_p)
def _swap(ev: Evaluator, eqn: JaxprEqn, invals: Values) -> Values:
    ref = resolve(invals[0], eqn_params.operand_tree(eqn).unflatten(invals[2:]))
    old = None
    if not isinstance(eqn.outvars[0], DropVar) and eqn.outvars[0] not in ev.unread:
        ev.machine.layout.swap_read()
        old = ev.machine.read(ref, check_written=False)
    elif ev.machine.layout.races:
        _count_old_read(ev)
    ev.machine.write(ref, invals[1])
    return [old]


def _count_old_read(ev: Evaluator) -> None:
    """A swap whose old value nothing reads: its read is counted as checked, as the
    engine counts a swap (a read and a write), but not made: the write's race check
    covers it (a box a DMA moves into meets both), and reading would make the trace keep
    the never-written fill for it (`Layout.swap_read`)."""
    ev.machine.note_checked(1)


@rule(prims.ref_addupdate_p)
def _addupdate(ev: Evaluator, eqn: JaxprEqn, invals: Values) -> Values:
    ref = resolve(invals[0], eqn_params.operand_tree(eqn).unflatten(invals[2:]))
    old = ev.machine.read(ref)
    ev.machine.write(ref, old + jnp.asarray(invals[1]).astype(old.dtype))
    return []


@rule(prims.pl_load_p)
def _masked_load(ev: Evaluator, eqn: JaxprEqn, invals: Values) -> Values:
    ref, transforms, mask, _ = eqn_params.args_tree(eqn).unflatten(invals)
    if mask is not None:
        raise Unsupported("a masked load")
    return [_cast(ev.machine.read(resolve(ref, transforms)), eqn.outvars[0].aval)]


@rule(prims.pl_swap_p)
def _masked_swap(ev: Evaluator, eqn: JaxprEqn, invals: Values) -> Values:
    ref, transforms, value, mask = eqn_params.args_tree(eqn).unflatten(invals)
    if mask is not None:
        raise Unsupported("a masked store")
    view = resolve(ref, transforms)
    old = None
    if not isinstance(eqn.outvars[0], DropVar) and eqn.outvars[0] not in ev.unread:
        ev.machine.layout.swap_read()
        old = ev.machine.read(view, check_written=False)
    elif ev.machine.layout.races:
        _count_old_read(ev)
    ev.machine.write(view, value)
    return [old]


# -- the grid ------------------------------------------------------------------------------

@rule(prims.program_id_p)
def _program_id(ev: Evaluator, eqn: JaxprEqn, invals: Values) -> Values:
    axis = eqn_params.grid_axis(eqn)
    if axis >= len(ev.point):
        raise Unsupported("`program_id` outside the grid")
    return [jnp.asarray(ev.point[axis], jnp.int32)]


@rule(prims.num_programs_p)
def _num_programs(ev: Evaluator, eqn: JaxprEqn, invals: Values) -> Values:
    return [jnp.int32(ev.grid[eqn_params.grid_axis(eqn)])]


@rule(prims.multiple_of_p)
def _multiple_of(ev: Evaluator, eqn: JaxprEqn, invals: Values) -> Values:
    return [invals[0]]


# -- the TPU's own conversions (no CPU lowering: one definition with the engine's) ------------

@rule(prims.pack_elementwise_p)
def _pack(ev: Evaluator, eqn: JaxprEqn, invals: Values) -> Values:
    return [conversions.pack(invals, eqn_params.packed_dtype(eqn), aval_dtype(eqn.outvars[0]),
                             jnp)]


@rule(prims.unpack_elementwise_p)
def _unpack(ev: Evaluator, eqn: JaxprEqn, invals: Values) -> Values:
    return [conversions.unpack(invals[0], eqn_params.unpack_index(eqn),
                               eqn_params.packed_dtype(eqn), eqn_params.unpacked_dtype(eqn),
                               jnp)]


@rule(prims.stochastic_round_p)
def _stochastic_round(ev: Evaluator, eqn: JaxprEqn, invals: Values) -> Values:
    target = eqn_params.rounding_target(eqn)
    read = conversions.bits_read(invals[0], invals[1], target, jnp)
    ev.machine.flag(read.weight >= conversions.LIKELY_WEIGHT, Verdict.RANDOM_BITS_FIXED)
    return [conversions.stochastic_round(invals[0], invals[1], target, jnp)]


# -- DMAs and semaphores -------------------------------------------------------------------

@rule(prims.dma_start_p)
def _dma_start(ev: Evaluator, eqn: JaxprEqn, invals: Values) -> Values:
    src, dst, dst_sem, src_sem, device_id = eqn_params.dma_arguments(eqn, invals)
    if device_id is not None or src_sem is not None:
        raise Unsupported("a remote DMA")
    if eqn_params.adds(eqn):
        raise Unsupported("a DMA that adds")
    src_ref, dst_ref, sem_ref = resolve(src), resolve(dst), resolve(dst_sem)
    machine = ev.machine
    if sem_ref.sem and not machine.semaphores[sem_ref.buffer].counts_bytes:
        raise Unsupported("a DMA that signals a regular semaphore")
    # A site is what a landing does: which box sizes move between which buffers (the
    # starts are the DMA's own); DMA starts that move alike share one branch of it.
    key = (src_ref.buffer, dst_ref.buffer, src_ref.sizes, dst_ref.sizes)
    machine.dma_start(key, src_ref, dst_ref, sem_ref)
    return []


@rule(prims.dma_wait_p)
def _dma_wait(ev: Evaluator, eqn: JaxprEqn, invals: Values) -> Values:
    src, _, dst_sem, src_sem, device_id = eqn_params.dma_arguments(eqn, invals)
    if device_id is not None or src_sem is not None:
        raise Unsupported("a remote DMA")
    src_ref = resolve(src)
    info = ev.machine.buffers[src_ref.buffer]
    ev.machine.wait(resolve(dst_sem), math.prod(src_ref.shape) * info.dtype.itemsize)
    return []


@rule(prims.semaphore_signal_p)
def _signal(ev: Evaluator, eqn: JaxprEqn, invals: Values) -> Values:
    sem, transforms, inc, device_id, core_index = eqn_params.args_tree(eqn).unflatten(invals)
    if device_id is not None or core_index is not None:
        raise Unsupported("a signal to another device or core")
    ev.machine.signal(resolve(sem, transforms), inc)
    return []


@rule(prims.semaphore_wait_p)
def _sem_wait(ev: Evaluator, eqn: JaxprEqn, invals: Values) -> Values:
    sem, transforms, value, decrement = eqn_params.args_tree(eqn).unflatten(invals)
    if decrement is not None and not isinstance(decrement, (bool, np.bool_)):
        raise Unsupported("a traced decrement")
    ev.machine.wait(resolve(sem, transforms), value,
                    decrement=decrement is None or bool(decrement))
    return []


@rule(prims.semaphore_read_p)
def _sem_read(ev: Evaluator, eqn: JaxprEqn, invals: Values) -> Values:
    sem, transforms = eqn_params.args_tree(eqn).unflatten(invals)
    ref = resolve(sem, transforms)
    if ev.machine.semaphores[ref.buffer].counts_bytes:
        # what a kernel reads of a DMA semaphore is in the generation's unit
        # (engine/dma/counts.py); the engine knows the generation
        raise Unsupported("a read of a DMA semaphore's count")
    return [ev.machine.count(ref)]


# -- scoped allocations --------------------------------------------------------------------

def allocate(machine: Machine, name: str, aval: Any, var: Any = None) -> Ref:
    """A new buffer or semaphore array for a ref aval (scratch, run_scoped), allocated for
    the kernel's variable `var`."""
    inner = value_aval(aval)
    shape = tuple(int(n) for n in inner.shape)
    dtype = getattr(inner, "dtype", None)
    if dtype is not None and jnp.issubdtype(dtype, semaphore_dtype):
        if jnp.issubdtype(dtype, barrier_semaphore_dtype):
            raise Unsupported("a barrier semaphore")
        counts_bytes = not jnp.issubdtype(dtype, regular_semaphore_dtype)
        return Ref.whole(machine.add_semaphores(name, shape, counts_bytes), shape, sem=True)
    if dtype is None:
        raise Unsupported("an allocation with no element type")
    info = BufferInfo(name, shape, np.dtype(dtype), tracked=True, scratch=True)
    whole = var not in machine.layout.accessed_in_part
    return Ref.whole(machine.add_buffer(info, whole_shadow=whole), shape)


@rule(prims.run_scoped_p)
def _run_scoped(ev: Evaluator, eqn: JaxprEqn, invals: Values) -> Values:
    body: Jaxpr = eqn_params.body(eqn)
    machine = ev.machine
    buffers, sems = len(machine.buffers), len(machine.semaphores)
    refs = [allocate(machine, f"scoped{k}", v.aval, v) for k, v in enumerate(body.invars)]
    outs = ev.run(body, invals[len(invals) - len(body.constvars):], refs)
    machine.free(len(machine.buffers) - buffers, len(machine.semaphores) - sems)
    return outs


# -- control flow --------------------------------------------------------------------------

def _inline(ev: Evaluator, closed: ClosedJaxpr, invals: Values) -> Values:
    n = len(closed.jaxpr.invars)
    return ev.run(closed.jaxpr, closed.consts, invals[len(invals) - n:])


@rule(prims.jit_p)
def _jit(ev: Evaluator, eqn: JaxprEqn, invals: Values) -> Values:
    return _inline(ev, eqn_params.body(eqn), invals)


@rule(prims.closed_call_p)
def _closed_call(ev: Evaluator, eqn: JaxprEqn, invals: Values) -> Values:
    return _inline(ev, eqn_params.call_body(eqn), invals)


for _custom in prims.custom_call_primitives:
    RULES[_custom] = lambda ev, eqn, invals: _inline(ev, eqn_params.primal_jaxpr(eqn), invals)


def carried_buffers(ev: Evaluator, eqn: JaxprEqn, invals: Values) -> list[int]:
    """The buffers a loop or branch may write: its written refs' and, when it waits,
    every buffer a DMA may land in."""
    positions, lands, waited = eqn_writes(eqn)
    found: set[int] = set()
    for k in positions:
        value = invals[k]
        while isinstance(value, TransformedRef):
            value = value.ref
        if isinstance(value, Ref) and not value.sem:
            found.add(value.buffer)
    if lands:
        named = {_semaphore_of(invals[k]) for k in waited or ()}
        sems = None if waited is None or None in named else {k for k in named if k is not None}
        found |= ev.machine.landing_targets(found, sems)
    return sorted(found)


def _semaphore_of(value: Any) -> int | None:
    """The semaphore array a ref operand names (None: not one the trace can name)."""
    while isinstance(value, TransformedRef):
        value = value.ref
    return value.buffer if isinstance(value, Ref) and value.sem else None


@rule(prims.cond_p)
def _cond(ev: Evaluator, eqn: JaxprEqn, invals: Values) -> Values:
    index, *operands = invals
    machine = ev.machine
    branches_ = eqn_params.branches(eqn)
    if len(branches_) == 1:
        return _inline(ev, branches_[0], operands)
    carried = carried_buffers(ev, eqn, invals)
    before = machine.snapshot()
    init = machine.carry(carried)
    entry, exits = machine.maybe_active, list[bool]()

    def branch(closed: ClosedJaxpr) -> Callable[[Carry], LoopCarry]:
        def run(carry: Carry) -> LoopCarry:
            machine.reset(before)
            machine.enter(carry, carried, entry)
            outs = ev.run(closed.jaxpr, closed.consts, operands)
            return machine.leave(carried, exits), outs
        return run

    carry, outs = lax.switch(jnp.asarray(index, jnp.int32),
                             [branch(b) for b in branches_], init)
    machine.reset(before)
    machine.restore(carry, carried)
    machine.maybe_active = entry or any(exits)
    return list(outs)


def _reads_state(jaxpr: Jaxpr) -> bool:
    return any(eqn.primitive in RULES and eqn.primitive not in (prims.jit_p, prims.cond_p)
               for eqn in jaxpr.eqns)


@rule(prims.while_p)
def _while(ev: Evaluator, eqn: JaxprEqn, invals: Values) -> Values:
    loop = eqn_params.while_loop(eqn)
    if _reads_state(loop.cond.jaxpr):
        raise Unsupported("a while condition that reads a ref")
    cond_consts = invals[:loop.cond_nconsts]
    body_consts = invals[loop.cond_nconsts:loop.cond_nconsts + loop.body_nconsts]
    init = invals[loop.cond_nconsts + loop.body_nconsts:]
    machine = ev.machine
    carried = carried_buffers(ev, eqn, invals)
    before = machine.snapshot()
    start = machine.carry(carried)

    def cond(carry: LoopCarry) -> Any:
        return ev.run(loop.cond.jaxpr, loop.cond.consts, [*cond_consts, *carry[1]])[0]

    def trace(assumed: bool, exits: list[bool]) -> LoopCarry:
        def body(carry: LoopCarry) -> LoopCarry:
            machine.reset(before)
            machine.enter(carry[0], carried, assumed)
            outs = ev.run(loop.body.jaxpr, loop.body.consts, [*body_consts, *carry[1]])
            return machine.leave(carried, exits), outs
        return lax.while_loop(cond, body, (start, list(init)))

    state, outs = machine.loop(trace)
    machine.reset(before)
    machine.restore(state, carried)
    return list(outs)


@rule(prims.scan_p)
def _scan(ev: Evaluator, eqn: JaxprEqn, invals: Values) -> Values:
    loop = eqn_params.scan_loop(eqn)
    consts = invals[:loop.num_consts]
    init = invals[loop.num_consts:loop.num_consts + loop.num_carry]
    xs = invals[loop.num_consts + loop.num_carry:]
    machine = ev.machine
    carried = carried_buffers(ev, eqn, invals)
    before = machine.snapshot()
    start = machine.carry(carried)
    counted: list[tuple[int, int]] = []

    def trace(assumed: bool, exits: list[bool]) -> tuple[LoopCarry, Values]:
        def body(carry: LoopCarry, x: Values) -> tuple[LoopCarry, Values]:
            machine.reset(before)
            machine.enter(carry[0], carried, assumed)
            outs = ev.run(loop.body.jaxpr, loop.body.consts, [*consts, *carry[1], *x])
            counted.append(machine.take_counted())  # (added once, times the trips)
            state = machine.leave(carried, exits)
            return (state, outs[:loop.num_carry]), outs[loop.num_carry:]
        return lax.scan(body, (start, list(init)), list(xs), length=loop.length,
                        reverse=loop.reverse)

    (state, carry), ys = machine.loop(trace, loop.length)
    machine.reset(before)
    machine.restore(state, carried)
    if loop.length:
        machine.note_checked(counted[-1][0] * loop.length, counted[-1][1])
    return [*carry, *ys]
