"""Plain programs in two variants that a key must tell apart, run by a process of their
own (tests/jaxbridge/test_program_identity.py): `python _program_cases.py CACHE VARIANT
CASE...` installs the program store on CACHE (engine/runtime/disk_cache.py), runs each
case's variant and prints one JSON line: per case its result, the numpy reference for that
variant, and what the store did while the case's program ran (found, lowered and kept,
refused; the jaxprs JAX lowered meanwhile)."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.interpreters import mlir

from pallas_check.engine.runtime import disk_cache
from pallas_check.jaxbridge import program_store
from pallas_check.jaxbridge.chip_arithmetic import chip_arithmetic

LOWERED = "/jax/core/compile/jaxpr_to_mlir_module_duration"
CASES: dict[str, Callable[[str], tuple[Any, Any, dict[str, Any]]]] = {}
_X = np.linspace(-1.0, 1.0, 8, dtype=np.float32)


def case(fn: Callable[[str], tuple[Any, Any, dict[str, Any]]]) -> Callable[..., Any]:
    CASES[fn.__name__] = fn
    return fn


@contextlib.contextmanager
def watched() -> Iterator[dict[str, Any]]:
    """What the store did, and which programs JAX lowered, while open."""
    lowered: list[str] = []

    def listen(event: str, seconds: float, **kwargs: object) -> None:
        if event == LOWERED:
            lowered.append(str(kwargs.get("fun_name")))

    fields = ("identity_hits", "identity_misses", "identity_refused", "identity_unkept")
    before = {f: getattr(program_store.counts, f) for f in fields}
    seen: dict[str, Any] = {"lowered": lowered}
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield seen
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
        seen.update({f: getattr(program_store.counts, f) - before[f] for f in fields})


def run(fn: Callable[..., Any], *args: Any) -> tuple[Any, dict[str, Any]]:
    """`fn(*args)` ready, watched."""
    with watched() as seen:
        out = jax.block_until_ready(fn(*args))
    return out, seen


def _captured(values: np.ndarray, wrap: Any) -> tuple[Any, Any, dict[str, Any]]:
    """`ones @ values` with `values` captured by the jitted function (as `wrap` makes it)."""
    constant = wrap(values)
    ones = np.ones(values.size, np.float32)
    out, seen = run(jax.jit(lambda v: jnp.dot(v, constant)), ones)
    return out, np.dot(ones, values), seen


@case
def large_constant(variant: str) -> tuple[Any, Any, dict[str, Any]]:
    """Two jax.numpy constants of 10000 values, equal but for one added to each."""
    k = {"a": 0.0, "b": 1.0}[variant]
    return _captured(np.arange(10000, dtype=np.float32) / 1000 + k, jnp.asarray)


@case
def large_numpy_constant(variant: str) -> tuple[Any, Any, dict[str, Any]]:
    """The same with a numpy array captured."""
    k = {"a": 0.0, "b": 2.0}[variant]
    return _captured(np.arange(10000, dtype=np.float32) / 1000 + k, lambda v: v)


@case
def literal(variant: str) -> tuple[Any, Any, dict[str, Any]]:
    k = {"a": 3.0, "b": 4.0}[variant]
    out, seen = run(jax.jit(lambda v: v * k), _X)
    return out, _X * np.float32(k), seen


@case
def dtype(variant: str) -> tuple[Any, Any, dict[str, Any]]:
    """A bfloat16 operand times a Python float (weakly typed: bfloat16 product) or a
    float32 scalar (a float32 product)."""
    w = {"a": 3.0, "b": np.float32(3.0)}[variant]
    x = jnp.asarray(_X, jnp.bfloat16)
    out, seen = run(jax.jit(lambda v, s: v * s), x, w)
    want = (np.asarray(x) * np.float32(3.0)).astype(
        {"a": jnp.bfloat16, "b": np.float32}[variant])
    return out, want, seen


@case
def weak_type(variant: str) -> tuple[Any, Any, dict[str, Any]]:
    """The same equations on a weakly typed (Python) or a strongly typed float32 scalar:
    only the operand's weak type tells them apart; it decides the result's."""
    w = {"a": 2.5, "b": np.float32(2.5)}[variant]
    out, seen = run(jax.jit(lambda s: jnp.sin(s)), w)
    return out, np.sin(np.float32(2.5)), {**seen, "weak": bool(out.weak_type)}


@case
def donation(variant: str) -> tuple[Any, Any, dict[str, Any]]:
    """Donating its operand (a) or not (b): the operand is read again after the call."""
    donate = (0,) if variant == "a" else ()
    x = jnp.asarray(_X) + 0.0
    out, seen = run(jax.jit(lambda v: v * 5.0 + 1.0, donate_argnums=donate), x)
    after = None if x.is_deleted() else np.asarray(x).tolist()
    return out, _X * np.float32(5.0) + np.float32(1.0), {**seen, "operand_after": after}


@case
def x64(variant: str) -> tuple[Any, Any, dict[str, Any]]:
    with jax.enable_x64(variant == "b"):
        out, seen = run(jax.jit(lambda v: v.astype(jnp.float64) / 3.0), _X)
    wide = np.float64 if variant == "b" else np.float32
    return out, (_X.astype(wide) / 3.0).astype(wide), seen


@case
def matmul_precision(variant: str) -> tuple[Any, Any, dict[str, Any]]:
    """The default precision changes the lowered product (XLA:CPU computes both exactly)."""
    a = np.arange(64, dtype=np.float32).reshape(8, 8) / 7
    with jax.default_matmul_precision(None if variant == "a" else "float32"):
        out, seen = run(jax.jit(lambda u, v: u @ v), a, a)
    return out, (a.astype(np.float64) @ a).astype(np.float32), seen


@case
def chip_rounding(variant: str) -> tuple[Any, Any, dict[str, Any]]:
    """pallas-check's chip arithmetic (b) rounds a float32 product's operands to
    bfloat16: the same jaxpr, another program."""
    a = np.arange(64, dtype=np.float32).reshape(8, 8) / 7
    with chip_arithmetic(variant == "b"):
        out, seen = run(jax.jit(lambda u, v: u @ v.T), a, a)
    operand = a if variant == "a" else np.asarray(jnp.asarray(a, jnp.bfloat16), np.float32)
    return out, (operand.astype(np.float64) @ operand.T).astype(np.float32), seen


@case
def branch(variant: str) -> tuple[Any, Any, dict[str, Any]]:
    other = {"a": jnp.cos, "b": jnp.tan}[variant]
    out, seen = run(jax.jit(lambda v, p: lax.cond(p, jnp.sin, other, v)), _X, False)
    return out, {"a": np.cos, "b": np.tan}[variant](_X), seen


@case
def branch_constant(variant: str) -> tuple[Any, Any, dict[str, Any]]:
    """A cond branch and a scan body closing over a large array that differs."""
    k = {"a": 0.0, "b": 0.5}[variant]
    values = np.arange(10000, dtype=np.float32) / 1000 + k
    shift = jnp.asarray(values)

    def program(v: Any, p: Any) -> Any:
        chosen = lax.cond(p, lambda u: u + shift, lambda u: u - shift, v)
        summed, _ = lax.scan(lambda c, _: (c + shift, None), chosen, None, length=2)
        return summed[::1000]

    out, seen = run(jax.jit(program), np.zeros(10000, np.float32), True)
    return out, (3 * values)[::1000], seen


@case
def loop_literal(variant: str) -> tuple[Any, Any, dict[str, Any]]:
    """A literal inside a while loop's body."""
    k = {"a": 2.0, "b": 3.0}[variant]
    out, seen = run(jax.jit(lambda v: lax.fori_loop(0, 3, lambda i, c: c * k, v)), _X)
    return out, _X * np.float32(k) ** 3, seen


_scale_p = jax.extend.core.Primitive("script_scale")
_scale_p.def_abstract_eval(lambda x: x)


@case
def own_primitive(variant: str) -> tuple[Any, Any, dict[str, Any]]:
    """A primitive of the script's with its own lowering, which the script changed between
    the two processes: its jaxpr is the same, its program is not (never keyed)."""
    k = {"a": 2.0, "b": 3.0}[variant]
    mlir.register_lowering(_scale_p, mlir.lower_fun(lambda x: x * k, multiple_results=False))
    out, seen = run(jax.jit(lambda v: _scale_p.bind(v) + 1.0), _X)
    return out, _X * np.float32(k) + np.float32(1.0), seen


@case
def pure_callback(variant: str) -> tuple[Any, Any, dict[str, Any]]:
    def host(v: Any) -> Any:
        return np.asarray(v) * 7.0

    shape = jax.ShapeDtypeStruct(_X.shape, _X.dtype)
    out, seen = run(jax.jit(lambda v: jax.pure_callback(host, shape, v) + 1.0), _X)
    return out, _X * np.float32(7.0) + np.float32(1.0), seen


@case
def debug_print(variant: str) -> tuple[Any, Any, dict[str, Any]]:
    def program(v: Any) -> Any:
        jax.debug.print("printed {}", v.sum())
        return v * 2.0

    out, seen = run(jax.jit(program), _X)
    return out, _X * np.float32(2.0), seen


def main(argv: list[str]) -> None:
    cache, variant, names = Path(argv[0]), argv[1], argv[2:]
    store = disk_cache.ScriptPrograms(cache)
    program_store.install(store)
    results = {}
    for name in names:
        out, want, seen = CASES[name](variant)
        results[name] = {"out": np.asarray(out, np.float64).tolist(),
                         "dtype": str(np.asarray(out).dtype),
                         "want": np.asarray(want, np.float64).tolist(),
                         "want_dtype": str(np.asarray(want).dtype), **seen}
    program_store.uninstall()
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1:])
