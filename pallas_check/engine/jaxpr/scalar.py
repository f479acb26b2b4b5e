"""Segments of scalar integer and boolean arithmetic, run by numpy instead of XLA.

Pipelines (BlockSpec grids, `emit_pipeline`) compute their block indices, slot numbers
and "has the block changed" predicates as short runs of scalar `add`/`rem`/`eq`/`select_n`
equations: thousands of tiny segments per call, where dispatching a compiled XLA
function costs far more than the arithmetic. Such a segment is turned into one
straight-line Python function over numpy scalars of the same dtypes, so that
integer results wrap exactly as XLA's do. Anything numpy and XLA might disagree on (a
division by zero, the most negative value divided by -1, a `select_n` case out of range)
falls back to the compiled segment.
"""

from __future__ import annotations

import itertools
from typing import Callable, Sequence, cast

import numpy as np
from pallas_check.jaxbridge import params as eqn_params
from pallas_check.engine.jaxpr.avals import aval_dtype
from pallas_check.jaxbridge.types import Atom, ClosedJaxpr, DropVar, JaxprEqn, Literal, Var


class _Fallback(Exception):
    """This input is one numpy would answer differently from XLA: use the compiled segment."""


def _div(a: np.integer, b: np.integer) -> np.integer:
    if b == 0 or (a.dtype.kind == "i" and b == -1 and a == np.iinfo(a.dtype).min):
        raise _Fallback
    q = abs(int(a)) // abs(int(b))  # XLA rounds toward zero, numpy's // toward -inf
    return a.dtype.type(q if (a < 0) == (b < 0) else -q)


def _rem(a: np.integer, b: np.integer) -> np.integer:
    if b == 0 or (a.dtype.kind == "i" and b == -1 and a == np.iinfo(a.dtype).min):
        raise _Fallback
    r = abs(int(a)) % abs(int(b))  # the sign of the dividend, as C's and XLA's
    return a.dtype.type(-r if a < 0 else r)


def _select(which: np.generic, *cases: np.generic) -> np.generic:
    index = int(which)
    if not 0 <= index < len(cases):
        raise _Fallback
    return cases[index]


def _clamp(low: np.generic, x: np.generic, high: np.generic) -> np.generic:
    clamped: np.generic = np.minimum(np.maximum(x, low), high)  # bounds in either order
    return clamped  # (XLA's clamp)


def _convert(x: np.generic, dtype: np.dtype) -> np.generic:
    # Wraps modulo 2**bits, as XLA's convert. (numpy types `a[()]` as an array: on a 0-d
    # one it is the scalar.)
    return np.asarray(x).astype(dtype)[()]  # type: ignore[return-value]


_BINARY = {"add": "+", "sub": "-", "mul": "*", "and": "&", "or": "|", "xor": "^",
           "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_CALLS = {"div": "_div", "rem": "_rem", "max": "_max", "min": "_min", "select_n": "_select",
          "clamp": "_clamp", "sign": "_sign"}  # (`sign`: jnp's `//` on integers)
_UNARY = {"neg": "-", "not": "~"}
_HELPERS = {"_div": _div, "_rem": _rem, "_select": _select, "_convert": _convert,
            "_clamp": _clamp, "_max": np.maximum, "_min": np.minimum, "_sign": np.sign}
SUPPORTED = frozenset(_BINARY) | frozenset(_CALLS) | frozenset(_UNARY) | {
    "convert_element_type"}


def is_integer(aval: object) -> bool:
    """An integer or boolean value, of any shape."""
    dtype = getattr(aval, "dtype", None)
    return dtype is not None and np.dtype(dtype).kind in "biu"


def is_int_scalar(aval: object) -> bool:
    return getattr(aval, "shape", None) == () and is_integer(aval)


# Calls whose body is inlined when all of it qualifies (`jnp.where` on scalars is a jit).
_INLINED = frozenset({"jit", "pjit"})


def eqn_qualifies(eqn: JaxprEqn) -> bool:
    """Whether numpy can run this equation (scalar integer or boolean arithmetic)."""
    if eqn.primitive.name in _INLINED:
        closed = eqn_params.maybe_body(eqn)
        return (isinstance(closed, ClosedJaxpr) and not closed.jaxpr.constvars
                and all(is_int_scalar(v.aval) for v in (*eqn.invars, *eqn.outvars))
                and all(eqn_qualifies(inner) for inner in closed.jaxpr.eqns))
    if eqn.primitive.name not in SUPPORTED or eqn.primitive.multiple_results:
        return False
    if not all(is_int_scalar(v.aval) for v in (*eqn.invars, *eqn.outvars)):
        return False
    return not (eqn.primitive.name == "convert_element_type"
                and not eqn_params.is_plain_conversion(eqn))


def _qualifies(eqns: Sequence[JaxprEqn], invars: Sequence[Var]) -> bool:
    return (all(is_int_scalar(v.aval) for v in invars)
            and all(eqn_qualifies(eqn) for eqn in eqns))


def _expression(eqn: JaxprEqn, args: list[str], consts: dict[str, object]) -> str:
    name = eqn.primitive.name
    if name in _BINARY:
        return f"({args[0]} {_BINARY[name]} {args[1]})"
    if name in _UNARY:
        return f"({_UNARY[name]}{args[0]})"
    if name == "convert_element_type":
        # (JAX types an aval as AbstractValue; a scalar operand's is a ShapedArray)
        source = np.dtype(eqn.invars[0].aval.dtype)  # type: ignore[attr-defined]
        target = np.dtype(eqn_params.target_dtype(eqn))
        key = f"_dt{len(consts)}"
        if target == np.bool_:
            return f"({args[0]} != 0)"
        if source == np.bool_:  # the commonest: a predicate as 0 or 1
            consts[f"{key}_0"], consts[f"{key}_1"] = target.type(0), target.type(1)
            return f"({key}_1 if {args[0]} else {key}_0)"
        consts[key] = target
        return f"_convert({args[0]}, {key})"
    return f"{_CALLS[name]}({', '.join(args)})"


def _source(eqns: Sequence[JaxprEqn], invars: Sequence[Var],
            outvars: Sequence[Var], consts: dict[str, object]) -> str:
    """The segment as one Python function: `def segment(a0, a1, ...)`, one line per
    equation (a jit's body inlined), literals as named numpy scalars of their dtypes."""
    names: dict[Var, str] = {v: f"a{i}" for i, v in enumerate(invars)}
    lines = [f"def segment({', '.join(names[v] for v in invars)}):"]
    temps = itertools.count()

    def atom(v: Atom, scope: dict[Var, str]) -> str:
        if isinstance(v, Literal):
            key = f"_c{len(consts)}"
            consts[key] = np.asarray(v.val, dtype=v.aval.dtype)[()]  # type: ignore[attr-defined]
            return key
        return scope[v]

    def emit(body: Sequence[JaxprEqn], scope: dict[Var, str]) -> None:
        for eqn in body:
            args = [atom(v, scope) for v in eqn.invars]
            if eqn.primitive.name in _INLINED:
                inner = eqn_params.body(eqn).jaxpr
                inner_scope = dict(zip(inner.invars, args))
                emit(inner.eqns, inner_scope)
                for out, result in zip(eqn.outvars, inner.outvars):
                    if not isinstance(out, DropVar):
                        scope[out] = atom(result, inner_scope)
                continue
            out = eqn.outvars[0]
            target = "_" if isinstance(out, DropVar) else f"t{next(temps)}"
            if target != "_":
                scope[out] = target
            lines.append(f"    {target} = {_expression(eqn, args, consts)}")

    emit(eqns, names)
    lines.append(f"    return [{', '.join(atom(v, names) for v in outvars)}]")
    return "\n".join(lines)


def scalar_segment_fn(eqns: Sequence[JaxprEqn], invars: Sequence[Var],
                      outvars: Sequence[Var],
                      compiled: Callable[..., list[object]]
                      ) -> Callable[..., list[object]] | None:
    """A numpy function for a segment of scalar integer/boolean equations (None when the
    segment has other equations); `compiled` answers the inputs numpy could get wrong."""
    if not eqns or not _qualifies(eqns, invars):
        return None
    consts: dict[str, object] = dict(_HELPERS)
    namespace = consts
    source = _source(eqns, invars, outvars, consts)
    exec(compile(source, "<pallas-check scalar segment>", "exec"), namespace)  # noqa: S102
    body = cast(Callable[..., list[object]], namespace["segment"])  # (`exec` defined it)
    scalar_types = [aval_dtype(v).type for v in invars]

    def run(*args: object) -> list[object]:
        values = [x if type(x) is kind else _as_scalar(x, kind)
                  for x, kind in zip(args, scalar_types)]
        try:
            # numpy scalars: 0-d values, like XLA's. Integer overflow wraps, as in XLA
            # (the engine runs a call under np.errstate(over="ignore"): no warning).
            return body(*values)
        except _Fallback:
            return compiled(*args)

    return run


def _as_scalar(x: object, kind: type[np.generic]) -> np.generic:
    """A segment input (a jax or numpy array, a Python or numpy scalar) as a numpy scalar
    of the segment's dtype."""
    value = np.asarray(x)
    # (numpy types `a[()]` as an array: on a 0-d one it is the scalar)
    return (value if value.dtype == kind else value.astype(kind))[()]  # type: ignore[return-value]
