"""The one module that touches Pallas internals: a patched lowering of `pallas_call`.

While installed, every pallas_call that is lowered (eagerly, under jit, vmap, grad or
shard_map) becomes ONE host callback carrying the call's operands to a handler, which runs
our engine and returns the outputs. The user's own `interpret=` argument is ignored.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import core as jax_core
from jax._src.interpreters import mlir
from jax._src.pallas import pallas_call as pallas_call_module

# handler(params, operands, device, mesh_axes) -> outputs. Under shard_map every device's
# callback arrives on its own thread with its logical device id and the named mesh axes
# ((name, size) pairs, row-major); elsewhere device is 0 and mesh_axes is empty.
CallHandler = Callable[[dict, Sequence[np.ndarray], int, tuple], Sequence[np.ndarray]]

_lock = threading.Lock()
_saved: dict[str, Any] | None = None


def _make_lowering(handler: CallHandler) -> Callable[..., Any]:
    def lowering(ctx: mlir.LoweringRuleContext, *in_nodes: Any, **params: Any) -> Any:
        params.pop("interpret", None)
        result_shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in ctx.avals_out]

        def impl(*args: Any) -> Any:
            axes = tuple((name, int(size))
                         for name, size in jax_core.get_axis_env().axis_sizes.items())
            device = jnp.int32(0)
            for name, size in axes:
                device = device * size + jax.lax.axis_index(name)

            def host(device_id: Any, *operands: Any) -> list[np.ndarray]:
                outs = handler(params, [np.asarray(x) for x in operands], int(device_id), axes)
                return [np.asarray(o, dtype=s.dtype).reshape(s.shape)
                        for o, s in zip(outs, result_shapes)]

            return jax.experimental.io_callback(host, result_shapes, device, *args,
                                                ordered=False)

        return mlir.lower_fun(impl, multiple_results=True)(ctx, *in_nodes)

    return lowering


# What the hardware lowering is given as `interpret=`: False (Mosaic on a TPU, Triton or
# Mosaic GPU on a GPU). Tests set it to True to run the native modes' plumbing on a CPU,
# with JAX's HLO interpreter standing in for the hardware.
NATIVE_INTERPRET: Any = False


def _make_native_lowering(handler: Callable[..., Any], mode: str,
                          original: Any) -> Callable[..., Any]:
    """The hardware lowering of the call, in the same executable, plus one host callback.

    mode "alongside": the callback gets the operands and the hardware's outputs,
    handler(params, operands, device, mesh_axes, native_outputs), and what it returns is
    what the script gets. mode "observe": the hardware's outputs are what the script gets;
    the callback only shows the operands to handler(params, operands, device, mesh_axes).
    The hardware kernel is never run from inside a callback (re-entering a busy
    accelerator from its own host callback can deadlock).
    """

    def lowering(ctx: mlir.LoweringRuleContext, *in_nodes: Any, **params: Any) -> Any:
        params.pop("interpret", None)
        native = list(original.rule(ctx.replace(), *in_nodes, interpret=NATIVE_INTERPRET,
                                    **params))
        result_shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in ctx.avals_out]
        n_in = len(in_nodes)

        def impl(*args: Any) -> Any:
            operands, outs = args[:n_in], list(args[n_in:])
            axes = tuple((name, int(size))
                         for name, size in jax_core.get_axis_env().axis_sizes.items())
            device = jnp.int32(0)
            for name, size in axes:
                device = device * size + jax.lax.axis_index(name)
            if mode == "observe":
                def observe(device_id: Any, *arrays: Any) -> None:
                    handler(params, [np.asarray(x) for x in arrays], int(device_id), axes)

                jax.experimental.io_callback(observe, None, device, *operands, ordered=False)
                return outs

            def host(device_id: Any, *arrays: Any) -> list[np.ndarray]:
                arrays = [np.asarray(x) for x in arrays]
                res = handler(params, arrays[:n_in], int(device_id), axes, arrays[n_in:])
                return [np.asarray(o, dtype=s.dtype).reshape(s.shape)
                        for o, s in zip(res, result_shapes)]

            return jax.experimental.io_callback(host, result_shapes, device, *operands,
                                                *outs, ordered=False)

        sub = ctx.replace(avals_in=[*ctx.avals_in, *ctx.avals_out], tokens_out=None)
        lowered = mlir.lower_fun(impl, multiple_results=True)(sub, *in_nodes, *native)
        if sub.tokens_out is not None:
            ctx.set_tokens_out(sub.tokens_out)
        return lowered

    return lowering


def native_function(params: dict) -> Callable[..., Any]:
    """A jitted function running one pallas_call (its primitive's params, without
    `interpret`) through the hardware lowering; use it with no interception installed."""
    prim = pallas_call_module.pallas_call_p
    params = {k: v for k, v in params.items() if k != "interpret"}
    return jax.jit(lambda *args: prim.bind(*args, interpret=NATIVE_INTERPRET, **params))


def install(handler: CallHandler, mode: str = "replace") -> None:
    """Route every pallas_call lowered from now on to `handler` (one callback per call).

    mode "replace" (pallas-check run): the handler's outputs replace the call's; "alongside"
    and "observe" keep the hardware lowering too (see `_make_native_lowering`)."""
    global _saved
    import jax.experimental  # noqa: F401  (io_callback lives there)

    prim = pallas_call_module.pallas_call_p
    with _lock:
        if _saved is not None:
            raise RuntimeError("pallas-check interception is already installed")
        if mode not in ("replace", "alongside", "observe"):
            raise ValueError(f"unknown interception mode {mode!r}")
        if mode != "replace" and (mlir._lowerings.get(prim) is None or any(
                prim in rules for rules in mlir._platform_specific_lowerings.values())):
            raise RuntimeError("this JAX's pallas_call lowering is not the one pallas-check"
                               " knows how to wrap")
        _saved = {
            "default": mlir._lowerings.get(prim),
            "platforms": {p: rules.pop(prim) for p, rules in
                          mlir._platform_specific_lowerings.items() if prim in rules},
        }
        rule = (_make_lowering(handler) if mode == "replace"
                else _make_native_lowering(handler, mode, _saved["default"]))
        mlir.register_lowering(prim, rule, cacheable=False)
        # `pl.kernel` / `mpmd_map` kernels reach the same lowering through this module
        # function rather than through the primitive's registered rule.
        _saved["module_lowering"] = pallas_call_module._pallas_call_lowering
        pallas_call_module._pallas_call_lowering = rule
    # Executables compiled before now used the real lowering.
    jax.clear_caches()


def uninstall() -> None:
    """Restore JAX's own pallas_call lowering."""
    global _saved
    prim = pallas_call_module.pallas_call_p
    with _lock:
        if _saved is None:
            return
        if _saved["default"] is not None:
            mlir._lowerings[prim] = _saved["default"]
        else:
            mlir._lowerings.pop(prim, None)
        for platform, entry in _saved["platforms"].items():
            mlir._platform_specific_lowerings[platform][prim] = entry
        pallas_call_module._pallas_call_lowering = _saved["module_lowering"]
        _saved = None
    jax.clear_caches()


@contextlib.contextmanager
def intercepted(handler: CallHandler, mode: str = "replace") -> Iterator[None]:
    install(handler, mode)
    try:
        yield
    finally:
        uninstall()
