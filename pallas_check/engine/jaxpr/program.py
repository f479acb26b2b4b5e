"""Evaluates a kernel jaxpr: our rules for memory, sync and control flow; JAX for the rest.

A jaxpr is compiled once into a `Program`: maximal runs of pure equations become one
`jax.jit`-compiled segment (reused at every grid step), and every other equation gets a
rule from `RULES` (or a rule specialized for that one equation, `SPECIALIZERS`). At its
first evaluation a program becomes one generated Python generator function, a line per
step; evaluation is a generator so that a core can yield to the scheduler where another
actor could run (semaphore waits, DMA starts and waits).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Generator, Sequence, cast

import jax
import jax.numpy as jnp
from pallas_check.jaxbridge import params as eqn_params
from pallas_check.jaxbridge.keys import is_key_aval
from pallas_check.jaxbridge.jaxprs import has_cpu_lowering, open_jaxpr, structure_text, sub_jaxprs
from pallas_check.jaxbridge.types import (AbstractRef, Atom, ClosedJaxpr, DropVar, Jaxpr, JaxprEqn,
                                         Literal, Var)

from pallas_check.engine.jaxpr import segment_order
from pallas_check.engine.jaxpr.evaluating import Evaluating
from pallas_check.engine.jaxpr.halts import (CallHalted, EngineBug, KernelError,
                                              UnsupportedPrimitive)
from pallas_check.engine.jaxpr.mosaic_limits import NotLowered
from pallas_check.engine.jaxpr.registry import BODY_ONLY, RULES, Rule, RuleFn, SPECIALIZERS
from pallas_check.engine.jaxpr.scalar import eqn_qualifies, scalar_segment_fn
from pallas_check.engine.runtime.caches import BoundedCache
from pallas_check.jaxbridge.chip_arithmetic import in_effect as arithmetic_in_effect
from pallas_check.engine.jaxpr.segment_cache import SEGMENT_COMPILER_OPTIONS as SEGMENT_COMPILER_OPTIONS
from pallas_check.engine.jaxpr.segment_cache import DiskCachedSegment as DiskCachedSegment
from pallas_check.engine.runtime.scheduler import Wait
from pallas_check.findings.finding import SourceFrame
from pallas_check.findings.sourceinfo import user_frames


# An evaluation: a generator that yields to the scheduler (a `Wait`, or None where another
# actor may run: runtime/scheduler.py) and returns the jaxpr's output values. A value is whatever the jaxpr's
# variables hold (a numpy or jax array, a numpy scalar, one of our refs, a semaphore ...):
# the evaluator only passes values on, so they are `object` here.
Gen = Generator[Wait | None, None, list[object]]

# A jaxpr's generated function: `run(ctx, consts, args)`.
Run = Callable[[Evaluating, Sequence[object], Sequence[object]], Gen]

# A compiled segment: its inputs by position -> its outputs by position.
SegmentFn = Callable[..., list[object]]


# ---------------------------------------------------------------------------------------
# Programs: a jaxpr cut into pure segments and ruled equations.


@dataclasses.dataclass
class Segment:
    """A run of pure equations, compiled once with jax.jit."""

    eqns: list[JaxprEqn]
    invars: list[Var]
    outvars: list[Var]
    fn: SegmentFn | None = None


@dataclasses.dataclass
class Program:
    jaxpr: Jaxpr
    steps: list[Segment | JaxprEqn]
    # The steps as one generated function (`_generate`), made at the first evaluation.
    run: Run | None = None


# Programs by jaxpr identity; compiled segments by their structure (the segment's equations
# as text, without source lines), so that a kernel traced anew at every eager call -- a new
# jaxpr each time -- reuses the segments compiled for its first call.
_programs = BoundedCache(256)
_segment_fns = BoundedCache(1024)


def _is_ref(aval: object) -> bool:
    return isinstance(aval, AbstractRef)


def _eqn_is_pure(eqn: JaxprEqn) -> bool:
    if eqn.primitive in RULES and (eqn.primitive not in BODY_ONLY
                                   or not has_cpu_lowering(eqn.primitive)):
        return False
    # Refs are ours; typed PRNG keys are numpy arrays of their words (jaxbridge/keys.py),
    # which only rules read.
    for v in eqn.invars:
        if _is_ref(getattr(v, "aval", None)) or is_key_aval(getattr(v, "aval", None)):
            return False
    for v in eqn.outvars:
        if _is_ref(v.aval) or is_key_aval(v.aval):
            return False
    for sub in sub_jaxprs(eqn):
        if not all(_eqn_is_pure(e) for e in sub.eqns):
            return False
    return True


def program_for(jaxpr: Jaxpr, skip_floats: bool) -> Program:
    """The compiled program of a jaxpr (cached while the jaxpr lives, bounded)."""
    return _programs.for_object(jaxpr, (skip_floats, arithmetic_in_effect()),
                                lambda: _build_program(jaxpr, skip_floats))


def structure_key(jaxpr: Jaxpr) -> str:
    """A jaxpr's equations as text, every parameter spelled out and no source lines: equal
    for two tracings of the same code on the same shapes."""
    return structure_text(jaxpr)


def _segment_fn(segment: Segment, skip_floats: bool) -> SegmentFn:
    """The compiled function of a segment, shared with every segment of the same structure
    (it takes the segment's inputs and returns its outputs by position)."""
    structure = open_jaxpr(segment.invars, segment.outvars, segment.eqns)
    key = (structure_key(structure), skip_floats, arithmetic_in_effect())
    return _segment_fns.get_or_make(key, lambda: _compile_segment(segment, skip_floats,
                                                                  repr(key)))


def _check_lowerable(eqn: JaxprEqn) -> None:
    """A pure equation JAX cannot run on a CPU is unsupported: say which and where."""
    if not has_cpu_lowering(eqn.primitive):
        raise UnsupportedPrimitive(
            f"pallas-check does not support the primitive '{eqn.primitive.name}'",
            user_frames(eqn.source_info),
        )
    for sub in sub_jaxprs(eqn):
        for inner in sub.eqns:
            _check_lowerable(inner)


def _build_program(jaxpr: Jaxpr, skip_floats: bool) -> Program:
    eqns = jaxpr.eqns
    pure = [_eqn_is_pure(eqn) for eqn in eqns]
    order = segment_order.schedule(eqns, jaxpr.outvars,
                                   [p and not eqn.effects for p, eqn in zip(pure, eqns)])
    steps: list[Segment | JaxprEqn] = []
    current: list[JaxprEqn] = []
    for i in order:
        eqn = eqns[i]
        if pure[i]:
            _check_lowerable(eqn)
            current.append(eqn)
            continue
        steps.extend(_segments_of_run(current))
        current = []
        steps.append(eqn)
    steps.extend(_segments_of_run(current))
    # Liveness: a segment returns what later steps or the jaxpr's outputs read; a ruled
    # equation's results nobody reads become dropped variables (a store then does not copy
    # out the old value it would return).
    needed_later: set[Var] = {v for v in jaxpr.outvars if isinstance(v, Var)}
    for k in range(len(steps) - 1, -1, -1):
        step = steps[k]
        if isinstance(step, Segment):
            defined = {v for e in step.eqns for v in e.outvars if not _is_dropvar(v)}
            used: list[Var] = []
            seen: set[Var] = set()
            for e in step.eqns:
                for v in e.invars:
                    if isinstance(v, Var) and v not in defined and v not in seen:
                        seen.add(v)
                        used.append(v)
            step.invars = used
            step.outvars = [v for e in step.eqns for v in e.outvars
                            if not _is_dropvar(v) and v in needed_later]
            step.fn = _segment_fn(step, skip_floats)
            step.fn = scalar_segment_fn(step.eqns, step.invars, step.outvars,
                                        step.fn) or step.fn
            needed_later -= defined
            needed_later.update(used)
        else:
            if any(not _is_dropvar(v) and v not in needed_later for v in step.outvars):
                steps[k] = step.replace(outvars=[
                    v if _is_dropvar(v) or v in needed_later else DropVar(v.aval)
                    for v in step.outvars])
            needed_later.update(v for v in step.invars if isinstance(v, Var))
    return Program(jaxpr, steps)


def _segments_of_run(eqns: list[JaxprEqn]) -> list[Segment]:
    """A run of pure equations as segments: the scalar integer arithmetic that numpy can run
    and that needs nothing else of the run first, then the rest (compiled). Kept together,
    a pipeline's index arithmetic would make XLA take each scalar as an argument of the
    kernel's matmul segment: slower than both apart."""
    scalar: list[JaxprEqn] = []
    rest: list[JaxprEqn] = []
    from_rest: set[Var] = set()
    for eqn in eqns:
        if eqn_qualifies(eqn) and not any(v in from_rest for v in eqn.invars
                                          if isinstance(v, Var)):
            scalar.append(eqn)
        else:
            rest.append(eqn)
            from_rest.update(eqn.outvars)
    if not scalar or not rest:
        return [Segment(eqns, [], [])] if eqns else []
    return [Segment(scalar, [], []), Segment(rest, [], [])]


def _is_dropvar(v: object) -> bool:
    return isinstance(v, DropVar)


def _is_float(aval: object) -> bool:
    dtype = getattr(aval, "dtype", None)
    return dtype is not None and jnp.issubdtype(dtype, jnp.floating)


def _compile_segment(segment: Segment, skip_floats: bool, identity: str) -> SegmentFn:
    """The segment as one jitted function, found on disk by `identity` (its structure and
    how it is evaluated) when a process compiled it before (engine/jaxpr/segment_cache.py)."""
    eqns, invars, outvars = segment.eqns, segment.invars, segment.outvars

    def run(*args: object) -> list[object]:
        env: dict[Var, object] = dict(zip(invars, args))

        def read(v: Atom) -> object:
            return v.val if isinstance(v, Literal) else env[v]

        for eqn in eqns:
            if skip_floats and eqn.outvars and all(_is_float(v.aval) for v in eqn.outvars):
                outs = [jnp.full(v.aval.shape, jnp.inf, v.aval.dtype)  # type: ignore[attr-defined]
                        for v in eqn.outvars]  # (JAX types avals as AbstractValue)
            else:
                params = eqn_params.bind_params(eqn)
                with eqn.ctx.manager:
                    # (JAX leaves `Primitive.bind` unannotated)
                    outs = eqn.primitive.bind(  # type: ignore[no-untyped-call]
                        *map(read, eqn.invars), **params)
                if not eqn.primitive.multiple_results:
                    outs = [outs]
            for v, value in zip(eqn.outvars, outs):
                if not _is_dropvar(v):
                    env[v] = value
        return [env[v] for v in outvars]

    jitted = jax.jit(run, compiler_options=SEGMENT_COMPILER_OPTIONS)
    # (JAX leaves ShapeDtypeStruct unannotated and types avals as AbstractValue)
    avals = [jax.ShapeDtypeStruct(  # type: ignore[no-untyped-call]
        v.aval.shape, v.aval.dtype,  # type: ignore[attr-defined]
        weak_type=getattr(v.aval, "weak_type", False)) for v in invars]
    return DiskCachedSegment(jitted, avals, identity)


# ---------------------------------------------------------------------------------------
# Evaluation: a program as one generated Python function.


def eval_jaxpr(ctx: Evaluating, jaxpr: Jaxpr, consts: Sequence[object],
               args: Sequence[object]) -> Gen:
    """Evaluate `jaxpr` on concrete values: a generator returning the output values."""
    return runner_for(jaxpr, ctx.config.skip_floats)(ctx, consts, args)


def runner_for(jaxpr: Jaxpr, skip_floats: bool) -> Run:
    """`run(ctx, consts, args)`, the generated function of a jaxpr's program (a rule that
    evaluates the same sub-jaxpr at every step may keep it)."""
    program = program_for(jaxpr, skip_floats)
    run = program.run
    if run is None:
        run = program.run = _generate(program)
    return run


def _generate(program: Program) -> Run:
    """The program as one Python generator function, `run(ctx, consts, args)`: a line per
    step, variables as locals, each step's rule, equation and literals bound by name. A
    kernel body runs at every grid step; reading steps from a table and variables from a
    dict cost more than most rules."""
    jaxpr = program.jaxpr
    names: dict[Var, str] = {}
    bound: dict[str, object] = {"_located_error": _located_error, "_unsupported": _unsupported,
                             "current_frames": current_frames, "_ours": _ours}
    lines: list[str] = []

    def local(v: Var) -> str:
        name = names.get(v)
        if name is None:
            name = names[v] = f"v{len(names)}"
        return name

    def atom(v: Atom) -> str:
        if isinstance(v, Literal):
            name = f"L{len(bound)}"
            bound[name] = v.val
            return name
        return local(v)

    def unpack(names_: Sequence[str], source: str) -> None:
        if names_:
            lines.append(f"    {', '.join(names_)}{',' if len(names_) == 1 else ''} = {source}")

    unpack([local(v) for v in jaxpr.constvars], "consts")
    unpack([local(v) for v in jaxpr.invars], "args")
    dead_after = _dead_after(program)
    generator = False
    for k, step in enumerate(program.steps):
        if k > 0 and k - 1 in dead_after:
            lines.append(f"    del {', '.join(local(v) for v in dead_after[k - 1])}")
        if isinstance(step, Segment):
            bound[f"S{k}"], bound[f"G{k}"] = step.fn, step
            call = f"S{k}({', '.join(atom(v) for v in step.invars)})"
            lines += ["    try:", f"        _r = {call}", "    except Exception as exc:",
                      f"        raise _located_error(G{k}.eqns[0], exc) from exc"]
            unpack([local(v) for v in step.outvars], "_r")
            continue
        eqn = step
        bound[f"E{k}"] = eqn
        entry = RULES.get(eqn.primitive)
        if entry is None:
            lines.append(f"    raise _unsupported(E{k})")
            continue
        bound[f"R{k}"] = _rule_fn(eqn, entry)
        call = f"R{k}(ctx, E{k}, [{', '.join(atom(v) for v in eqn.invars)}])"
        kept = [(i, v) for i, v in enumerate(eqn.outvars) if not _is_dropvar(v)]
        target = ("" if not kept else "_r = " if eqn.primitive.multiple_results
                  else f"{local(kept[0][1])} = ")
        lines += _rule_lines(k, eqn, entry.is_generator, target, call, bound)
        generator = generator or entry.is_generator
        if kept and eqn.primitive.multiple_results:
            for i, v in kept:
                lines.append(f"    {local(v)} = _r[{i}]")
    if not generator:
        lines.append("    if False: yield  # a generator, as every evaluation is")
    lines.append(f"    return [{', '.join(atom(v) for v in jaxpr.outvars)}]")
    source = "def run(ctx, consts, args):\n" + "\n".join(lines) + "\n"
    exec(compile(source, "<pallas-check program>", "exec"), bound)  # noqa: S102
    return cast(Run, bound["run"])  # (`exec` defined it)


def _rule_fn(eqn: JaxprEqn, entry: Rule) -> RuleFn:
    """The rule an equation's step calls: its specializer's, else the general one."""
    specialize = SPECIALIZERS.get(eqn.primitive)
    try:
        return (specialize and specialize(eqn)) or entry.fn
    except Exception as exc:  # ours: say which equation it was preparing
        raise EngineBug(exc, eqn.primitive.name, user_frames(eqn.source_info),
                        verb="preparing the rule of") from exc


def _rule_lines(k: int, eqn: JaxprEqn, is_generator: bool, target: str,
                call: str, bound: dict[str, object]) -> list[str]:
    """The generated lines of ruled step `k`: `{target}{call}` (`yield from` the call of a
    generator rule). An exception of the rule is located right there, at its equation
    (`_ours`): a try costs nothing until something raises."""
    ours = ["    except Exception as exc:", f"        raise _ours(E{k}, ctx, exc)"]
    if not is_generator:
        return [f"    ctx.eqn = E{k}", "    try:", f"        {target}{call}", *ours]
    if eqn_params.has_params(eqn) and any(True for _ in sub_jaxprs(eqn)):
        # Pallas clips source tracebacks at each traced body: an equation inside (e.g.
        # the DMA of a sync_copy) may have no user frame; it gets ours (known now when
        # this equation has its own; else the enclosing one's, at run time).
        own = user_frames(eqn.source_info)
        bound[f"F{k}"] = own
        frames = f"F{k}" if own else "current_frames(ctx)"
        return [f"    ctx.eqn = E{k}", f"    ctx.frame_stack.append({frames})", "    try:",
                f"        {target}yield from {call}", *ours, "    finally:",
                "        ctx.frame_stack.pop()"]
    return [f"    ctx.eqn = E{k}", "    try:", f"        {target}yield from {call}", *ours]


def _dead_after(program: Program) -> dict[int, list[Var]]:
    """Per step, the variables no later step reads (nor the jaxpr returns): the generated
    function deletes them there, so that a value read from a ref as a view of its memory
    (memory.Buffer.lend) is let go before the ref is written again, which would
    otherwise copy the buffer to keep the value unchanged."""
    last_use: dict[Var, int] = {}
    for k, step in enumerate(program.steps):
        for v in step.invars:
            if isinstance(v, Var):
                last_use[v] = k
    for v in program.jaxpr.outvars:
        if isinstance(v, Var):
            last_use.pop(v, None)
    dead: dict[int, list[Var]] = {}
    for v, k in last_use.items():
        dead.setdefault(k, []).append(v)
    return dead


def _unsupported(eqn: JaxprEqn) -> UnsupportedPrimitive:
    avals = [getattr(v, "aval", None) for v in (*eqn.invars, *eqn.outvars)]
    what = "typed PRNG keys" if any(is_key_aval(a) for a in avals) else "refs"
    return UnsupportedPrimitive(
        f"pallas-check does not support the primitive '{eqn.primitive.name}'"
        f" with {what} as operands",
        user_frames(eqn.source_info),
    )


def current_frames(ctx: Evaluating) -> tuple[SourceFrame, ...]:
    """The user's frames for the equation being evaluated, or else for the nearest
    enclosing equation (cond, loop, run_scoped, jit) that has some."""
    return _frames_of(ctx.eqn, ctx)


def _frames_of(eqn: JaxprEqn | None, ctx: Evaluating) -> tuple[SourceFrame, ...]:
    frames = user_frames(eqn.source_info) if eqn is not None else ()
    if frames:
        return frames
    for outer in reversed(ctx.frame_stack):
        if outer:
            return outer
    return ()


# What a rule raises on purpose, already what it means: the kernel's error or limitation
# (KernelError), its defect ended cleanly (CallHalted), what Mosaic does not lower, and an
# error of ours already located by a nested equation.
_MEANT = (KernelError, CallHalted, NotLowered, EngineBug)


def _ours(eqn: JaxprEqn, ctx: Evaluating, exc: Exception) -> Exception:
    """What the generated program raises when evaluating `eqn` raised `exc`: `exc` itself
    when raised on purpose (a KernelError that says no line gets the equation's), anything
    else as an EngineBug naming the equation."""
    if isinstance(exc, _MEANT):
        if isinstance(exc, KernelError) and not exc.frames:
            exc.frames = _frames_of(eqn, ctx)
            exc.primitive = exc.primitive or eqn.primitive.name
        return exc
    bug = EngineBug(exc, eqn.primitive.name, _frames_of(eqn, ctx))
    bug.__cause__ = exc
    return bug


def _located_error(eqn: JaxprEqn, exc: Exception) -> KernelError:
    return KernelError(
        f"JAX failed to evaluate '{eqn.primitive.name}': {type(exc).__name__}: {exc}",
        user_frames(eqn.source_info),
    )


def eval_closed(ctx: Evaluating, closed: ClosedJaxpr, args: Sequence[object]) -> Gen:
    return eval_jaxpr(ctx, closed.jaxpr, closed.consts, args)


