"""The one place pallas-check touches JAX's private modules (`jax._src`).

Pallas has no stable plugin API: intercepting `pallas_call`, reading its GridMapping and the
kernel's jaxpr, and evaluating Pallas, Mosaic and state primitives all need JAX internals.
They are read here and handed out under pallas-check's own names:

- `types.py`: jaxpr, equation, var, ref, indexer and block-dim types (annotations, isinstance);
- `primitives.py`: every primitive the engine evaluates (`dma_start_p`, `ref_get_p` ...);
- `params.py`: the parameters of those equations, read by meaning (`operand_tree(eqn)`);
- `jaxprs.py`: what is done with a jaxpr through JAX (run, print, discharge, nested jaxprs);
- `call.py`: a pallas_call's params, GridMapping, BlockMappings and compiler params, read
  once into `CallDescription` (the "mosaic_tpu" / "mosaic" key difference handled there);
- `version.py`: the supported JAX range, checked when this package is imported.

- `lowering.py`: the interception's lowering plumbing (patch pallas_call's lowering, emit a
  host callback or an FFI call);
- below: the platform plumbing under pallas-check's names (`settle_runtime_tokens`,
  `jit_dispatch`, `device_questions`, `refuse_compiles` ...). No JAX module is handed out
  to pallas-check's modules (tests/jaxbridge/test_boundary.py).
Supporting a new JAX version: widen `version.py` (and pyproject's pin), run the tests and the
samples on it, and handle each difference in these modules, with a test in tests/jaxbridge/.

Importing this package imports JAX: modules that must run before JAX starts (the command
line, which sets XLA_FLAGS for --devices) import it lazily.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Callable

import jax as _jax

from pallas_check.jaxbridge import version as _version

_version.check(_jax.__version__)

# JAX's modules the plumbing functions below reach into (private: the rest of pallas-check
# calls the functions, under its own names; the lowering's are in lowering.py).
from jax._src import dispatch as _dispatch  # noqa: E402 - after the version check
from jax._src import pjit as _pjit  # noqa: E402
from jax._src.interpreters import mlir as _mlir  # noqa: E402
from jax._src import shard_map as _jax_shard_map  # noqa: E402
from jax._src import xla_bridge as _xla_bridge  # noqa: E402
from jax._src import compiler as _compiler  # noqa: E402
# Which chip a kernel is told it runs on, and JAX's device-mesh orderings per TPU device
# kind: handed out to tests, which look at what intercept/tpu_info.py's patches did.
from jax._src.pallas.mosaic import tpu_info as jax_tpu_info  # noqa: E402
from jax._src import mesh_utils as jax_mesh_utils  # noqa: E402


def xla_client() -> ModuleType:
    """The XLA client, for the engine's own CPU client (engine/runtime/backend.py)."""
    from jax._src.lib import xla_client as module

    return module



def backends_started() -> bool:
    """Whether JAX's backends have started, read without JAX's lock: process/children.py asks in
    a process just forked, where another thread of the parent may have held that lock."""
    return bool(_xla_bridge._backends)


def hlo_interpreter() -> ModuleType:
    """JAX's HLO interpreter of pallas_call (`diff --against hlo`)."""
    from jax._src.pallas import hlo_interpreter as module

    return module


def tpu_interpreter() -> ModuleType:
    """JAX's own TPU interpreter (`diff --against jax-interpret`): a competitor to compare
    with, never used to do pallas-check's work."""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as module

    return module


def tpu_interpret_params() -> type:
    """The InterpretParams class of JAX's TPU interpreter (`diff --against jax-interpret`)."""
    from jax._src.pallas.mosaic.interpret.params import InterpretParams

    return InterpretParams


def mosaic_dialect() -> ModuleType:
    """Mosaic's MLIR dialect (register_dialect): `--compile` reads the Mosaic module of a
    call back to map the operation the compiler failed on to its source line."""
    from jax._src.lib import tpu as module

    return module


# -- plumbing, under pallas-check's names (what each user does, not JAX's module) ----------

def settle_runtime_tokens() -> None:
    """Wait for the computations the script dispatched (run/runner.py); after our callback
    failed in one, forget JAX's tokens, whose errors JAX would raise again at exit."""
    tokens: Any = _dispatch.runtime_tokens  # untyped in JAX
    try:
        tokens.block_until_ready()
    except Exception:  # noqa: BLE001 - the error pallas-check already reports
        tokens.clear()


def mosaic_ir_context() -> Any:
    """An MLIR context with Mosaic's dialect registered (tpu_compile/mlirloc.py)."""
    context = _mlir.make_ir_context()
    mosaic_dialect().register_dialect(context)
    return context


def refuse_compiles(refuse: Callable[..., Any]) -> None:
    """Every later XLA compilation in this process calls `refuse` instead (process/children.py: a
    process forked after JAX's backends started cannot compile)."""
    _compiler.backend_compile_and_load = refuse


def default_backend_name() -> str:
    """The platform JAX's default backend runs on (process/children.py)."""
    return str(_xla_bridge.default_backend())


JitDispatch = tuple[Callable[..., Any], Callable[..., Any]]


def jit_dispatch() -> JitDispatch:
    """JAX's Python dispatch of a top-level jitted call and its fast-path data maker
    (`_pjit_call_impl_python`, `_get_fastpath_data`), which intercept/outer.py wraps."""
    return _pjit._pjit_call_impl_python, _pjit._get_fastpath_data


def set_jit_dispatch(dispatch_: JitDispatch) -> None:
    """Replace the pair `jit_dispatch` returns (intercept/outer.py's hook, and its undoing)."""
    _pjit._pjit_call_impl_python, _pjit._get_fastpath_data = dispatch_


def runs_host_callbacks(executable: object) -> bool:
    """Whether a jitted computation's executable (the first argument of JAX's fast-path
    data maker) calls back into Python: every program holding an intercepted pallas_call
    does (intercept/outer.py)."""
    call = getattr(executable, "unsafe_call", None)
    return bool(getattr(call, "has_host_callbacks", False))


DeviceQuestions = tuple[Callable[[], str], Callable[[], Any]]


def device_questions() -> DeviceQuestions:
    """What Pallas' TPU info asks of the default device: its kind and its core count
    (intercept/tpu_info.py answers them for a simulated chip)."""
    return jax_tpu_info.get_device_kind, jax_tpu_info.get_num_device_cores


def set_device_questions(questions: DeviceQuestions) -> None:
    jax_tpu_info.get_device_kind, jax_tpu_info.get_num_device_cores = questions


def clear_tpu_info_caches() -> None:
    """JAX's caches of what the chip answered (`get_tpu_info` per trace context,
    shard_map's manual abstract mesh per mesh)."""
    for fn in (jax_tpu_info.get_tpu_info, jax_tpu_info.get_tpu_info_for_chip,
               getattr(_jax_shard_map, "_as_manual_mesh", None)):
        clear = getattr(fn, "cache_clear", None)
        if clear is not None:
            clear()


def abstract_device_platform(device: _jax.sharding.AbstractDevice) -> str:
    """The platform of a mesh's abstract device. jax 0.10 records it (`platform`); jax 0.9
    records only the kind, which for a CPU device is "cpu" too."""
    platform = getattr(device, "platform", None)
    return str(platform if platform is not None else device.device_kind)


def abstract_device_with_cores(device: _jax.sharding.AbstractDevice,
                               num_cores: int) -> _jax.sharding.AbstractDevice:
    """The abstract device `device` with `num_cores` cores (jax 0.9's has no platform)."""
    if hasattr(device, "platform"):  # jax 0.10
        return _jax.sharding.AbstractDevice(device_kind=device.device_kind,
                                            num_cores=num_cores, platform=device.platform)
    make: Callable[..., _jax.sharding.AbstractDevice] = _jax.sharding.AbstractDevice
    return make(device_kind=device.device_kind, num_cores=num_cores)  # jax 0.9


def mesh_orderings() -> dict[str, Callable[..., Any]]:
    """JAX's device-mesh ordering per TPU device kind (intercept/tpu_info.py keeps CPU devices off)."""
    return jax_mesh_utils.device_kind_handler_dict


def set_mesh_orderings(orderings: dict[str, Callable[..., Any]]) -> None:
    jax_mesh_utils.device_kind_handler_dict = orderings

__all__ = [
    "DeviceQuestions", "JitDispatch", "abstract_device_platform",
    "abstract_device_with_cores", "backends_started", "clear_tpu_info_caches",
    "default_backend_name", "device_questions", "hlo_interpreter", "jax_mesh_utils",
    "jax_tpu_info", "jit_dispatch", "mesh_orderings", "mosaic_dialect", "mosaic_ir_context",
    "refuse_compiles", "runs_host_callbacks", "set_device_questions", "set_jit_dispatch", "set_mesh_orderings",
    "settle_runtime_tokens", "tpu_interpret_params", "tpu_interpreter", "xla_client",
]
