"""Whose code lowers a primitive: JAX's (or pallas-check's), or someone else's.

Why: jaxbridge/program_identity.py keys a plain program by its jaxpr, before lowering. The
jaxpr names a primitive, not the code that lowers it: a primitive the script defined with
its own lowering rule, or one of JAX's whose CPU rule the script (or another library)
replaced -- `mlir.register_lowering(lax.sin_p, mlir.lower_fun(f), platform="cpu")` --
compiles to whatever that code says today, which the key cannot see (the script may have
changed it since the entry was kept). Such a program is refused a key. Trusted: a
primitive defined in one of JAX's modules whose CPU rule is JAX's or pallas-check's code
through and through (pallas-check's own, such as the chip arithmetic's products, are in
the key by pallas-check's code digest; JAX's by its version).
"""

from __future__ import annotations

import functools
import sys
import threading
import types

from jax._src import core as _core
from jax._src.interpreters import mlir as _mlir

_OWN_MODULES = ("jax.", "jaxlib.", "pallas_check.")
_lock = threading.Lock()
_owners: dict[_core.Primitive, tuple[object, bool]] = {}  # primitive -> (its CPU rule, trusted)
_jax_primitives: set[_core.Primitive] = set()
_scanned: set[str] = set()


def trusted(primitive: _core.Primitive) -> bool:
    """Whether `primitive` is JAX's own and lowered for the CPU by JAX's or pallas-check's
    code (worked out once per primitive and rule: a rule registered again is looked at
    again)."""
    rule = cpu_rule(primitive)
    with _lock:
        known = _owners.get(primitive)
        if known is not None and known[0] is rule:
            return known[1]
        answer = rule is not None and _owned(rule) and _is_jax_primitive(primitive)
        _owners[primitive] = (rule, answer)
        return answer


def cpu_rule(primitive: _core.Primitive) -> object | None:
    """The rule that lowers `primitive` for the CPU (its own for the CPU, else its rule for
    every platform; None: it has none)."""
    entry = (_mlir._platform_specific_lowerings.get("cpu", {}).get(primitive)
             or _mlir._lowerings.get(primitive))
    return None if entry is None else entry.rule


def rule_name(primitive: _core.Primitive) -> str:
    return str(getattr(cpu_rule(primitive), "__name__", ""))


def _owned(code: object, depth: int = 0) -> bool:
    """Whether a lowering rule is JAX's or pallas-check's code through and through: the
    function, what a partial or a wrapper holds, and every function its closure holds (a
    rule of JAX's, such as `mlir.lower_fun(f)`, can wrap a function of the script's)."""
    if depth > 6:
        return False  # (too deep to tell)
    if isinstance(code, functools.partial):
        held = (code.func, *code.args, *code.keywords.values())
        return all(_owned(c, depth + 1) for c in held if callable(c) and not isinstance(c, type))
    if isinstance(code, types.MethodType):
        return _owned(code.__func__, depth + 1)
    if isinstance(code, types.FunctionType):
        if not code.__module__.startswith(_OWN_MODULES):
            return False
        wrapped = getattr(code, "__wrapped__", None)
        if wrapped is not None and not _owned(wrapped, depth + 1):
            return False
        for cell in code.__closure__ or ():
            try:
                held = cell.cell_contents
            except ValueError:  # (an empty cell)
                continue
            if callable(held) and not isinstance(held, type) and not _owned(held, depth + 1):
                return False
        return True
    return str(getattr(type(code), "__module__", "")).startswith(_OWN_MODULES) or (
        isinstance(code, types.BuiltinFunctionType)
        and str(getattr(code, "__module__", None) or "").startswith(_OWN_MODULES))


def _is_jax_primitive(primitive: _core.Primitive) -> bool:
    """Whether `primitive` is an attribute of one of JAX's modules (the modules imported
    since are looked through again when one is not found: JAX imports some late)."""
    if primitive in _jax_primitives:
        return True
    for name, module in list(sys.modules.items()):
        if name in _scanned or not (name == "jax" or name.startswith("jax.")):
            continue
        _scanned.add(name)
        for value in list(vars(module).values()) if module is not None else ():
            if isinstance(value, _core.Primitive):
                _jax_primitives.add(value)
    return primitive in _jax_primitives
