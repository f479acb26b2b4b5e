"""The lowering plumbing of the interception, under pallas-check's names.

intercept/patched_lowering.py routes every pallas_call to a Python host callback by replacing the
primitive's MLIR lowering. That needs JAX's lowering registry, its Python-callback and FFI
emitters and the pallas_call module's own lowering function: all private, read here only.
Each function does one thing intercept/patched_lowering.py does (patch the lowering, emit a callback, ...),
so a JAX that moves one of them changes this file, not the interception.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from jax.extend.core import Primitive

from jax._src import callback as _callback
from jax._src import ffi as _ffi
from jax._src import sharding_impls as _sharding_impls
from jax._src.interpreters import mlir as _mlir
from jax._src.interpreters import pxla as _pxla
from jax._src.pallas import pallas_call as _pallas_call

# The context JAX gives a lowering rule (its avals, module context, tokens).
LoweringRuleContext = _mlir.LoweringRuleContext


def register_lowering(primitive: Primitive, rule: Callable[..., Any]) -> None:
    """Lower `primitive` with `rule` on every platform, never cached (a rule closes over
    the handler of the run)."""
    _mlir.register_lowering(primitive, rule, cacheable=False)


def lower_fun(fn: Callable[..., Any], ctx: LoweringRuleContext, *nodes: Any) -> Any:
    """Lower the traced `fn` (several results) in the lowering context `ctx`."""
    return _mlir.lower_fun(fn, multiple_results=True)(ctx, *nodes)


def emit_host_callback(ctx: LoweringRuleContext, fn: Callable[..., Any], operands: Sequence[Any],
                       avals_in: Sequence[Any], avals_out: Sequence[Any]) -> list[Any]:
    """A side-effecting Python callback `fn` in the lowered module: its results."""
    sharding = _callback._callback_op_sharding(ctx.module_context.axis_context, None,
                                               avals_out)
    results, _, _ = _callback.emit_python_callback(
        ctx, fn, None, list(operands), list(avals_in), list(avals_out),
        has_side_effect=True, returns_token=False, sharding=sharding)
    return list(results)


def forget_lowered_modules() -> None:
    """Drop JAX's cache of lowered modules (keyed by the jaxpr, not by the compile
    options): a program compiled again with other options is lowered again, and the
    pallas_call lowering asked again (intercept/outer.py, when a call goes inline)."""
    cached = getattr(_pxla, "_cached_lowering_to_hlo", None)
    if cached is not None:
        cached.cache_clear()


def ffi_lowering(target: str, **kwargs: Any) -> Callable[..., Any]:
    """A side-effecting XLA FFI custom call to `target` (intercept/hostcall.py's lend / give back)."""
    return _ffi.build_ffi_lowering_function(target, has_side_effect=True, **kwargs)


def one_cpu_device(ctx: LoweringRuleContext) -> bool:
    """Whether the lowered computation runs on one CPU device."""
    axis_context = ctx.module_context.axis_context
    return (tuple(ctx.module_context.platforms) == ("cpu",)
            and isinstance(axis_context, _sharding_impls.ShardingContext)
            and axis_context.num_devices == 1)


# -- the pallas_call lowering ----------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class SavedLowering:
    """JAX's own pallas_call lowering, as `patch_pallas_call_lowering` found it."""

    default: Any  # the rule for every platform, or None
    platforms: dict[str, Any]  # platform -> its own rule (taken out while patched)
    module_lowering: Any  # pallas_call.py's `_pallas_call_lowering`


def pallas_call_lowering() -> Any:
    """JAX's rule that lowers pallas_call on every platform (None when it has none)."""
    return _mlir._lowerings.get(_pallas_call.pallas_call_p)


def pallas_call_lowering_is_plain() -> bool:
    """Whether pallas_call has one rule for every platform and none per platform (the
    shape a wrapping lowering knows how to call)."""
    prim = _pallas_call.pallas_call_p
    return pallas_call_lowering() is not None and not any(
        prim in rules for rules in _mlir._platform_specific_lowerings.values())


def patch_pallas_call_lowering(rule: Callable[..., Any]) -> SavedLowering:
    """Lower every pallas_call with `rule` (platform rules taken out; `pl.kernel` /
    `mpmd_map` kernels, which call pallas_call.py's lowering function directly, too)."""
    prim = _pallas_call.pallas_call_p
    saved = SavedLowering(
        pallas_call_lowering(),
        {p: rules.pop(prim) for p, rules in _mlir._platform_specific_lowerings.items()
         if prim in rules},
        _pallas_call._pallas_call_lowering)
    register_lowering(prim, rule)
    _pallas_call._pallas_call_lowering = rule
    return saved


def restore_pallas_call_lowering(saved: SavedLowering) -> None:
    prim = _pallas_call.pallas_call_p
    if saved.default is not None:
        _mlir._lowerings[prim] = saved.default
    else:
        _mlir._lowerings.pop(prim, None)
    for platform, entry in saved.platforms.items():
        _mlir._platform_specific_lowerings[platform][prim] = entry
    _pallas_call._pallas_call_lowering = saved.module_lowering
