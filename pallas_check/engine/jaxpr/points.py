"""An index map evaluated by numpy over every grid point at once.

A BlockSpec's index map is a few scalar integer equations (`i * 2 + j`, a `jnp.minimum`,
a `lax.rem`). Compiling it with XLA, vmapped over the grid points, costs about 15 ms per
index map, paid on the first call of every structure: the largest part of a small kernel's
first call, which is what a test suite pays. numpy runs the same equations on arrays of
the grid coordinates in microseconds, with XLA's integer semantics (division toward zero,
the remainder with the dividend's sign, wrapping overflow). What numpy might answer
differently (a division by zero, the most negative value divided by -1, a `select_n` case
out of range) and every equation outside that set leave the map to the compiled path.

An index map that reads scalar-prefetch operands (splash attention's block tables, paged
attention's page indices) reads them, once their refs are discharged, as one-element
`dynamic_slice`s: numpy indexes the operand with every point's indices at once, clamped
into the array as XLA clamps a slice's start.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from pallas_check.engine.jaxpr.scalar import eqn_qualifies, is_int_scalar, is_integer
from pallas_check.jaxbridge import params as eqn_params
from pallas_check.jaxbridge.types import Atom, ClosedJaxpr, Jaxpr, Literal


class NotByNumpy(Exception):
    """This map, or these points, are the compiled path's."""


def _checked_divisor(a: np.ndarray, b: np.ndarray) -> None:
    if np.any(b == 0) or (a.dtype.kind == "i" and np.any(
            (b == -1) & (a == np.iinfo(a.dtype).min))):
        raise NotByNumpy


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    _checked_divisor(a, b)
    q = np.abs(a) // np.abs(b)  # toward zero, as XLA (numpy's // rounds toward -inf)
    quotient: np.ndarray = np.where((a < 0) != (b < 0), -q, q).astype(a.dtype)
    return quotient


def _rem(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    _checked_divisor(a, b)
    r = np.abs(a) % np.abs(b)  # the dividend's sign, as XLA
    remainder: np.ndarray = np.where(a < 0, -r, r).astype(a.dtype)
    return remainder


def _select(which: np.ndarray, *cases: np.ndarray) -> np.ndarray:
    index = which.astype(np.int64)
    if np.any((index < 0) | (index >= len(cases))):
        raise NotByNumpy
    return np.choose(index, np.broadcast_arrays(*cases))


def _convert(eqn: Any, x: np.ndarray) -> np.ndarray:
    target = np.dtype(eqn_params.target_dtype(eqn))
    return x != 0 if target == np.bool_ else x.astype(target)  # ints wrap, as XLA's


_OPS: dict[str, Callable[..., np.ndarray]] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "and": np.bitwise_and,
    "or": np.bitwise_or, "xor": np.bitwise_xor, "eq": np.equal, "ne": np.not_equal,
    "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
    "max": np.maximum, "min": np.minimum, "neg": np.negative, "not": np.invert,
    "sign": np.sign,
    "div": _div, "rem": _rem, "select_n": _select,
    "clamp": lambda low, x, high: np.minimum(np.maximum(x, low), high),
}


def numpy_index_map(closed: ClosedJaxpr, num_outputs: int, num_grid: int | None = None
                    ) -> Callable[..., list[np.ndarray]] | None:
    """The map as a function of the grid coordinates' columns (each an int32 array over
    the points) and its array operands (the scalar-prefetch values: `closed`'s inputs after
    the first `num_grid`), returning its first `num_outputs` results as arrays over the
    points; None when an equation is not scalar integer arithmetic or a one-element read
    of an array operand. The function raises `NotByNumpy` for points numpy could answer
    differently from XLA."""
    jaxpr = closed.jaxpr
    arrays = frozenset(jaxpr.invars[num_grid:]) if num_grid is not None else frozenset()
    if jaxpr.constvars or not _runs(jaxpr, arrays):
        return None

    def run(columns: Sequence[np.ndarray], operands: Sequence[np.ndarray] = ()
            ) -> list[np.ndarray]:
        with np.errstate(over="ignore"):
            outs = _evaluate(jaxpr, [np.asarray(c, np.int32) for c in columns]
                             + [np.asarray(a) for a in operands])
        n = len(columns[0]) if columns else 1
        return [np.broadcast_to(o, (n,)) for o in outs[:num_outputs]]

    return run


def _reads_one(eqn: Any, arrays: frozenset[Any]) -> bool:
    """A one-element `dynamic_slice` of an array operand at integer scalar indices."""
    operand, *starts = eqn.invars
    return (not isinstance(operand, Literal) and operand in arrays
            and is_integer(operand.aval) and all(n == 1 for n in eqn_params.slice_sizes(eqn))
            and all(is_int_scalar(s.aval) for s in starts))


def _runs(jaxpr: Jaxpr, arrays: frozenset[Any] = frozenset()) -> bool:
    """Whether every equation is scalar integer arithmetic (scalar.py's test) of an
    operation this module has (its own set: a name scalar.py adds is not one here), or
    a one-element read of an array operand and its squeeze (the arrays read no other way)."""
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dynamic_slice":
            if not _reads_one(eqn, arrays):
                return False
            continue
        if any(not isinstance(v, Literal) and v in arrays for v in eqn.invars):
            return False
        if name == "squeeze":
            aval = eqn.invars[0].aval
            if not (is_integer(aval) and np.prod(getattr(aval, "shape", (0,))) == 1):
                return False
            continue
        if not eqn_qualifies(eqn) or not (name in _OPS or name == "convert_element_type"
                                          or (name in ("jit", "pjit")
                                              and _runs(eqn_params.body(eqn).jaxpr))):
            return False
    return True


def _read(operand: np.ndarray, *starts: np.ndarray) -> np.ndarray:
    """One element per point, its indices clamped into the operand (XLA clamps a
    dynamic slice's start so that the slice fits)."""
    at = tuple(np.clip(s.astype(np.int64), 0, n - 1) for s, n in zip(starts, operand.shape))
    return np.asarray(operand[at])


def _evaluate(jaxpr: Jaxpr, args: Sequence[np.ndarray]) -> list[np.ndarray]:
    env: dict[Any, np.ndarray] = dict(zip(jaxpr.invars, args))

    def read(atom: Atom) -> np.ndarray:
        if isinstance(atom, Literal):
            return np.asarray(atom.val, dtype=atom.aval.dtype)  # type: ignore[attr-defined]
        return env[atom]

    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        name = eqn.primitive.name
        if name in ("jit", "pjit"):
            outs = _evaluate(eqn_params.body(eqn).jaxpr, invals)
        elif name == "convert_element_type":
            outs = [_convert(eqn, invals[0])]
        elif name == "dynamic_slice":
            outs = [_read(*invals)]
        elif name == "squeeze":  # (of one element per point: the values as they are)
            outs = [invals[0]]
        else:
            outs = [np.asarray(_OPS[name](*invals))]
        env.update(zip(eqn.outvars, outs))
    return [read(v) for v in jaxpr.outvars]
