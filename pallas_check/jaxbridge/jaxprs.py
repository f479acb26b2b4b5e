"""What pallas-check does with a jaxpr through JAX's own functions: run one, find the
jaxprs nested in an equation, print one for a structural key, discharge its ref state,
ask whether a primitive lowers on the CPU, and the values that mark a dynamic grid size or
a semaphore dtype.

Each is one function here so that a module of pallas-check never names a module of
`jax._src`; a JAX version that changes one is handled here once.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Iterator, Mapping, Sequence

from jax._src import core as _core
from jax._src.interpreters import mlir as _mlir
from jax._src.pallas import core as _pallas_core
from jax._src.state import discharge as _discharge
from jax._src.state import types as _state_types

from pallas_check.jaxbridge.types import ClosedJaxpr, Jaxpr, JaxprEqn, Primitive

# A grid dimension bound at run time by an operand (`pl.pallas_call(grid=(n,))`, n traced).
dynamic_grid_dim: object = _pallas_core.dynamic_grid_dim
# The dtypes of a semaphore ref: any semaphore, a counting one, the barrier's.
semaphore_dtype: Any = _pallas_core.semaphore_dtype
regular_semaphore_dtype: Any = _pallas_core.semaphore
barrier_semaphore_dtype: Any = _pallas_core.barrier_semaphore


def jaxpr_as_fun(closed: ClosedJaxpr) -> Callable[..., list[Any]]:
    """A closed jaxpr as a Python function of its arguments (JAX evaluates it)."""
    fun: Callable[..., list[Any]] = _core.jaxpr_as_fun(closed)
    return fun


def sub_jaxprs(eqn: JaxprEqn) -> Iterator[Jaxpr]:
    """The jaxprs nested in an equation's params (a body, branches), open."""
    return _core.jaxprs_in_params(eqn.params)


_PP_SETTINGS = _core.JaxprPpSettings(source_info=False, name_stack=False,
                                     custom_pp_eqn_rules=False, print_effects=True)


def structure_text(jaxpr: Jaxpr) -> str:
    """A jaxpr's equations as text, every parameter spelled out and no source lines: equal
    for two tracings of the same code on the same shapes."""
    return str(_core.pp_jaxpr(jaxpr, _core.JaxprPpContext(), _PP_SETTINGS).format())


_PLAIN = (bool, int, float, str, type(None))


def _plain(value: Any) -> bool:
    """A param value whose text is the same in every process (no object, no counter)."""
    if isinstance(value, (tuple, list)):
        return all(_plain(v) for v in value)
    return isinstance(value, _PLAIN) or type(value).__name__ in ("dtype", "DType")


def stable_text(jaxpr: Jaxpr) -> str:
    """A jaxpr's structure as text equal in every process that traces the same code on the
    same shapes (a hardware recording's fingerprint, commands/recording.py): per equation,
    nested ones included, its primitive, its operands' and results' types, and its params
    whose values are plain (numbers, strings, dtypes). Left out: literal values and other
    params, which may hold a process's own counters or objects (checkify numbers each
    `pl.debug_check` from a per-process count, and keeps a traceback object)."""
    lines: list[str] = []

    def walk(inner: Jaxpr, depth: int) -> None:
        lines.append(f"{'  ' * depth}in {[str(v.aval) for v in inner.invars]}")
        for eqn in inner.eqns:
            params = {k: v for k, v in sorted(eqn.params.items()) if _plain(v)}
            lines.append(f"{'  ' * depth}{eqn.primitive.name}"
                         f" {[str(v.aval) for v in eqn.invars]}"
                         f" -> {[str(v.aval) for v in eqn.outvars]} {params}")
            for sub in sub_jaxprs(eqn):
                walk(sub, depth + 1)
        lines.append(f"{'  ' * depth}out {[str(v.aval) for v in inner.outvars]}")

    walk(jaxpr, 0)
    return "\n".join(lines)


# jax 0.10 discharges a ClosedJaxpr (`discharge_state(closed)`); jax 0.9's
# `discharge_state(jaxpr, consts)` takes an open one, and its ClosedJaxpr form is
# `discharge_state2`.
_discharge_closed: Callable[[ClosedJaxpr], ClosedJaxpr] = getattr(
    _discharge, "discharge_state2", _discharge.discharge_state)


def discharge_state(closed: ClosedJaxpr) -> ClosedJaxpr:
    """The jaxpr with its refs turned into plain array arguments and results."""
    return _discharge_closed(closed)


def transformed_shape(transforms: Sequence[Any], aval: Any) -> tuple[int, ...]:
    """The shape a ref of `aval` has through its transforms (a view, bitcast, reshape)."""
    return tuple(_state_types.transform_type(transforms, aval).shape)  # type: ignore[attr-defined]


def has_cpu_lowering(primitive: Primitive) -> bool:
    """Whether XLA can compile the primitive for the CPU (else it runs in our rules)."""
    return (primitive in _mlir._lowerings
            or primitive in _mlir._platform_specific_lowerings.get("cpu", {}))


def axis_sizes() -> dict[str, int]:
    """The named mesh axes (shard_map) around the equation being lowered, with sizes."""
    get_axis_env: Callable[[], Any] = _core.get_axis_env  # untyped in JAX
    return dict(get_axis_env().axis_sizes)


def open_jaxpr(invars: Sequence[Any], outvars: Sequence[Any], eqns: Sequence[Any]) -> Jaxpr:
    """A jaxpr of these equations with no constants, made only to be printed or keyed (so
    it needs no debug info: JAX's warning for its absence is silenced)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return Jaxpr([], list(invars), list(outvars), list(eqns))


# -- what JAX keeps beside a jaxpr's documented fields ---------------------------------------
# The documented interface of a jaxpr (JAX's "Understanding jaxprs" page and `jax.extend`) is
# a Jaxpr's constvars / invars / outvars / eqns / effects, a ClosedJaxpr's jaxpr / consts /
# in_avals / out_avals, an equation's primitive / invars / outvars / params, a variable's or
# literal's aval (and val). What JAX keeps beside them (a ref aval's `inner_aval`, a jaxpr's
# `debug_info` and what it holds) is read only here (tests/jaxbridge/test_boundary.py).

def is_ref_aval(aval: object) -> bool:
    """Whether the aval is a ref's (a kernel's ref, a scratch buffer, a prefetch ref): it
    holds the aval of the value the ref holds."""
    return hasattr(aval, "inner_aval")


def value_aval(aval: object) -> Any:
    """The aval of the value a ref holds, or the aval itself where it is no ref's."""
    return getattr(aval, "inner_aval", aval)


def arg_names(jaxpr: object, unnamed: str = "arg{}") -> list[str]:
    """One name per input of the jaxpr, as the traced function named its parameters (JAX's
    debug info); one it does not name is `unnamed` formatted with its position."""
    info = getattr(jaxpr, "debug_info", None)
    names = list(getattr(info, "arg_names", None) or ())
    count = len(getattr(jaxpr, "invars", ()))
    return [names[i] if i < len(names) and names[i] else unnamed.format(i) for i in range(count)]


def source_text(jaxpr: object) -> str | None:
    """Where the traced function was defined, as JAX writes it ('name at file:line'), or
    None where JAX kept no debug info."""
    text = getattr(getattr(jaxpr, "debug_info", None), "func_src_info", None)
    return text if isinstance(text, str) else None
