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
import numpy as np
from jax._src.interpreters import mlir
from jax._src.pallas import pallas_call as pallas_call_module

CallHandler = Callable[[dict, Sequence[np.ndarray]], Sequence[np.ndarray]]

_lock = threading.Lock()
_saved: dict[str, Any] | None = None


def _make_lowering(handler: CallHandler) -> Callable[..., Any]:
    def lowering(ctx: mlir.LoweringRuleContext, *in_nodes: Any, **params: Any) -> Any:
        params.pop("interpret", None)
        result_shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in ctx.avals_out]

        def host(*operands: Any) -> list[np.ndarray]:
            outs = handler(params, [np.asarray(x) for x in operands])
            return [np.asarray(o, dtype=s.dtype).reshape(s.shape)
                    for o, s in zip(outs, result_shapes)]

        def impl(*args: Any) -> Any:
            return jax.experimental.io_callback(host, result_shapes, *args, ordered=False)

        return mlir.lower_fun(impl, multiple_results=True)(ctx, *in_nodes)

    return lowering


def install(handler: CallHandler) -> None:
    """Route every pallas_call lowered from now on to `handler` (one callback per call)."""
    global _saved
    import jax.experimental  # noqa: F401  (io_callback lives there)

    prim = pallas_call_module.pallas_call_p
    with _lock:
        if _saved is not None:
            raise RuntimeError("pallas-check interception is already installed")
        _saved = {
            "default": mlir._lowerings.get(prim),
            "platforms": {p: rules.pop(prim) for p, rules in
                          mlir._platform_specific_lowerings.items() if prim in rules},
        }
        mlir.register_lowering(prim, _make_lowering(handler), cacheable=False)
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
        _saved = None
    jax.clear_caches()


@contextlib.contextmanager
def intercepted(handler: CallHandler) -> Iterator[None]:
    install(handler)
    try:
        yield
    finally:
        uninstall()
