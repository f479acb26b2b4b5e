"""The lowering plumbing of the interception, under pallas-check's names.

intercept/patched_lowering.py routes every pallas_call to a Python host callback by replacing the
primitive's MLIR lowering. That needs JAX's lowering registry, its Python-callback and FFI
emitters and the pallas_call module's own lowering function: all private, read here only.
Each function does one thing intercept/patched_lowering.py does (patch the lowering, emit a callback, ...),
so a JAX that moves one of them changes this file, not the interception.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from typing import Any, Callable, Hashable, Protocol, Sequence, cast

import jax
from jax.extend.core import Primitive

from jax._src import callback as _callback
from jax._src import config as _config
from jax._src import core as _core
from jax._src import pjit as _pjit
from jax._src import ffi as _ffi
from jax._src import sharding_impls as _sharding_impls
from jax._src.interpreters import mlir as _mlir
from jax._src.interpreters import pxla as _pxla
from jax._src.pallas import pallas_call as _pallas_call

try:  # `pl.kernel` / `core_map` kernels lower as an mpmd_map (jax 0.10)
    from jax._src.pallas import mpmd as _mpmd
except ImportError:  # pragma: no cover - a JAX whose core_map lowers as a pallas_call
    _mpmd = None  # type: ignore[assignment]

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
    """Drop what JAX's cache of lowered modules (keyed by the jaxpr, not by the compile
    options) holds of programs that run a kernel: such a program compiled again with other
    options is lowered again, and the pallas_call lowering asked again (intercept/outer.py,
    when a call goes inline). The plain programs' modules stay."""
    cached = getattr(_pxla, "_cached_lowering_to_hlo", None)
    if cached is not None:
        _evict(cached, _runs_kernel)


# -- whose programs JAX's caches hold ---------------------------------------------------------

# A value of JAX's configuration in the key of every cache JAX keeps of what it traced,
# lowered and compiled (its trace context and its C++ dispatch's key): 0 outside an
# interception, one number per interception's settings inside. Why: a program lowered
# while a pallas_call is intercepted runs the interception's host callbacks, and one
# lowered before runs JAX's own lowering: neither may be run in the other's place. Emptying
# all of JAX's caches at each start and end (as `jax.clear_caches()` does) also threw away
# every plain program a test suite's tests had compiled (each `jnp` operation of each test
# compiled again: 10-160 ms apiece; benchmarks/README.md, issue 55.3). Keyed, those stay,
# shared by every test run with the same settings, and by the code outside them.
_PROGRAMS_OPTION = "jax_pallas_check_programs"
_programs = _config.int_state(
    _PROGRAMS_OPTION, 0,
    "pallas-check: which interception's programs JAX's caches hold now (0: none).",
    include_in_jit_key=True, include_in_trace_context=True)
_program_keys: dict[Hashable, int] = {}


def begin_programs(owner: Hashable | None) -> None:
    """An interception begins: JAX's caches keyed by `owner` from now on (the same `owner`
    again finds what it left there), or, `owner` None, emptied."""
    if owner is None:
        jax.clear_caches()  # type: ignore[no-untyped-call]
        return
    value = _program_keys.setdefault(owner, len(_program_keys) + 1)
    jax.config.update(_PROGRAMS_OPTION, value)  # type: ignore[no-untyped-call]


def end_programs(owner: Hashable | None) -> None:
    """The interception `begin_programs(owner)` began ends. Keyed: what JAX lowered and
    compiled on its Python dispatch path (kept per jaxpr, per module) for a program that
    runs a kernel is dropped -- it runs this interception's callbacks and custom calls,
    which a later interception with the same key must not find -- and the key is that of
    no interception again. Everything else stays: JAX's traces, the plain programs'
    modules and executables (each `jnp` operation of a test suite lowered and compiled
    once, not once a test: benchmarks/README.md, issue 55), and the executables of its C++
    dispatch, where a program holding a pallas_call never is while intercepted
    (intercept/outer.py refuses it the fast path). `owner` None: all emptied."""
    if owner is None:
        jax.clear_caches()  # type: ignore[no-untyped-call]
        return
    for cache in (_pjit._pjit_lower, _pxla._cached_lowering_to_hlo):
        _evict(cache, _runs_kernel)
    _evict(_pxla._cached_compilation, kernel_module)
    _kernel_modules.clear()
    jax.config.update(_PROGRAMS_OPTION, 0)  # type: ignore[no-untyped-call]


# The modules the patched pallas_call lowering lowered a kernel into (weakly: JAX's
# compilation cache is keyed by the module object), dropped from that cache at the end.
_kernel_modules: "weakref.WeakSet[object]" = weakref.WeakSet()
_kernel_jaxprs: "weakref.WeakKeyDictionary[object, bool]" = weakref.WeakKeyDictionary()
_KERNEL_PRIMITIVE_NAMES = frozenset({"pallas_call", "mpmd_map"})


def note_kernel_module(ctx: LoweringRuleContext) -> None:
    """The patched pallas_call lowering lowers a kernel into `ctx`'s module: the
    executable compiled from it is dropped when the interception ends."""
    try:
        _kernel_modules.add(ctx.module_context.module)
    except TypeError:  # pragma: no cover - a module that cannot be weakly referenced
        _kernel_modules_unkeyed[0] = True


_kernel_modules_unkeyed = [False]


def kernel_module(module: object) -> bool:
    """Whether the patched pallas_call lowering lowered a kernel into `module` (an MLIR
    module JAX is about to compile) during this interception."""
    return _kernel_modules_unkeyed[0] or module in _kernel_modules


def _runs_kernel(closed: object) -> bool:
    """Whether a (closed) jaxpr runs a pallas_call or a `pl.kernel` anywhere in it;
    worked out once per jaxpr."""
    try:
        return _kernel_jaxprs[closed]
    except KeyError:
        pass
    except TypeError:  # not weakly referenceable: said to run one (dropped, to be safe)
        return True
    jaxpr = getattr(closed, "jaxpr", closed)
    answer = any(eqn.primitive.name in _KERNEL_PRIMITIVE_NAMES
                 or any(_runs_kernel(sub) for sub in _core.jaxprs_in_params(eqn.params))
                 for eqn in getattr(jaxpr, "eqns", ()))
    try:
        _kernel_jaxprs[closed] = answer
    except TypeError:
        pass
    return answer


class _WeakrefCache(Protocol):
    """JAX's weakref-keyed LRU cache (jaxlib's `weakref_lru_cache`)."""

    def cache_keys(self) -> list[tuple[object, ...]]: ...

    def evict_weakref(self, obj: object) -> None: ...

    def cache_clear(self) -> None: ...


def _evict(cache: _WeakrefCache, drop: Callable[[object], bool]) -> None:
    """Drop from one of JAX's weakref-keyed caches every entry whose key object `drop`
    names; emptied whole where this JAX's cache cannot say what it holds."""
    try:
        keyed = [cast(Callable[[], object], key[0])() for key in cache.cache_keys()]
        for obj in {id(o): o for o in keyed if o is not None}.values():
            if drop(obj):
                cache.evict_weakref(obj)
    except (AttributeError, IndexError, TypeError):  # pragma: no cover - another JAX
        cache.cache_clear()


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
    mesh_kernels: Any = None  # mpmd_map's rule entry, where `hardware` patched it


def pallas_call_lowering() -> Any:
    """JAX's rule that lowers pallas_call on every platform (None when it has none)."""
    return _mlir._lowerings.get(_pallas_call.pallas_call_p)


def pallas_call_lowering_is_plain() -> bool:
    """Whether pallas_call has one rule for every platform and none per platform (the
    shape a wrapping lowering knows how to call)."""
    prim = _pallas_call.pallas_call_p
    return pallas_call_lowering() is not None and not any(
        prim in rules for rules in _mlir._platform_specific_lowerings.values())


def patch_pallas_call_lowering(rule: Callable[..., Any], hardware: bool = False
                               ) -> SavedLowering:
    """Lower every pallas_call with `rule` (platform rules taken out; `pl.kernel` /
    `mpmd_map` kernels, which call pallas_call.py's lowering function directly off a TPU,
    too). `hardware` (a rule that also lowers the call for the hardware,
    `hardware_nodes`): on a TPU too, where JAX lowers an mpmd_map kernel its own way."""
    prim = _pallas_call.pallas_call_p
    saved = SavedLowering(
        pallas_call_lowering(),
        {p: rules.pop(prim) for p, rules in _mlir._platform_specific_lowerings.items()
         if prim in rules},
        _pallas_call._pallas_call_lowering,
        _mlir._lowerings.get(_mpmd.mpmd_map_p) if hardware and _mpmd is not None else None)
    register_lowering(prim, rule)
    _pallas_call._pallas_call_lowering = rule
    if saved.mesh_kernels is not None:
        register_lowering(_mpmd.mpmd_map_p, _mesh_kernel_rule(saved.mesh_kernels.rule))
    return saved


# The platforms on which JAX lowers an mpmd_map kernel without pallas_call's lowering (its
# TPU rule builds the Mosaic module itself); elsewhere its fallback lowers it as a call.
MESH_KERNELS_OWN_LOWERING = ("tpu",)
_hardware = threading.local()  # the chip's lowering of the mpmd_map being lowered, pending


def _mesh_kernel_rule(jax_rule: Any) -> Callable[..., Any]:  # (JAX's rule entry)
    """mpmd_map's lowering while a hardware rule is patched in: on a TPU, the kernel as
    the pallas_call JAX's fallback makes of it (its grid the mesh) goes to the patched
    rule, and that rule's `hardware_nodes` are JAX's own TPU lowering of the kernel."""

    def rule(ctx: LoweringRuleContext, *in_nodes: Any, **params: Any) -> Any:
        if (tuple(ctx.module_context.platforms) != MESH_KERNELS_OWN_LOWERING
                or len(params["jaxprs"]) != 1 or params.get("external_meshes")):
            return jax_rule(ctx, *in_nodes, **params)  # (off a TPU: the fallback, patched)
        _hardware.pending = lambda c: jax_rule(c, *in_nodes, **params)
        try:
            return _mpmd._mpmd_map_fallback_lowering(ctx, *in_nodes, **params)
        finally:
            _hardware.pending = None

    return rule


def hardware_nodes(rule: Any, ctx: LoweringRuleContext, in_nodes: Sequence[Any],
                   params: dict[str, Any], interpret: Any) -> list[Any]:
    """The call's outputs as the hardware lowering makes them: pallas_call's `rule`
    (JAX's, as `patch_pallas_call_lowering` found it), or for a mesh kernel on a TPU
    (`_mesh_kernel_rule`) JAX's own lowering of its mpmd_map."""
    fresh: Any = ctx.replace  # (JAX's copy of the context: untyped)
    pending = getattr(_hardware, "pending", None)
    if pending is not None:
        _hardware.pending = None
        return list(pending(fresh()))
    return list(rule(fresh(), *in_nodes, interpret=interpret, **params))


def restore_pallas_call_lowering(saved: SavedLowering) -> None:
    prim = _pallas_call.pallas_call_p
    if saved.default is not None:
        _mlir._lowerings[prim] = saved.default
    else:
        _mlir._lowerings.pop(prim, None)
    for platform, entry in saved.platforms.items():
        _mlir._platform_specific_lowerings[platform][prim] = entry
    _pallas_call._pallas_call_lowering = saved.module_lowering
    if saved.mesh_kernels is not None:
        _mlir._lowerings[_mpmd.mpmd_map_p] = saved.mesh_kernels
