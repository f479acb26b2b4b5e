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

The module handouts below (`mlir`, `pjit`, `callback_module` ...) remain for the interception
and platform plumbing (intercept.py, outer.py, tpu_info.py, runner.py, hostcall.py,
tpu_compile/); tests/jaxbridge/test_boundary.py lists which modules still use them.
Supporting a new JAX version: widen `version.py` (and pyproject's pin), run the tests and the
samples on it, and handle each difference in these modules, with a test in tests/jaxbridge/.

Importing this package imports JAX: modules that must run before JAX starts (the command
line, which sets XLA_FLAGS for --devices) import it lazily.
"""

from __future__ import annotations

from types import ModuleType

import jax as _jax

from pallas_check.jaxbridge import version as _version

_version.check(_jax.__version__)

# Python host callbacks emitted straight into a lowered module (intercept.py).
from jax._src import callback as callback_module  # noqa: E402 - after the version check
# Runtime tokens of side-effecting computations, settled after our callback failed.
from jax._src import dispatch  # noqa: E402
# Lowering of XLA FFI custom calls (hostcall.py's lend / give_back).
from jax._src import ffi  # noqa: E402
# The sharding context of a lowering: one device or several (intercept.py).
from jax._src import sharding_impls  # noqa: E402
# The dispatch of a top-level jitted call (`_pjit_call_impl_python`, `_get_fastpath_data`),
# hooked by outer.py to know the jitted call around a kernel.
from jax._src import pjit  # noqa: E402
# MLIR lowering registry: where the pallas_call lowering is patched (intercept.py).
from jax._src.interpreters import mlir  # noqa: E402
# The pallas_call primitive's own lowering (intercept.py).
from jax._src.pallas import pallas_call as pallas_call_module  # noqa: E402
# Which chip a kernel is told it runs on (tpu_info.py).
from jax._src.pallas.mosaic import tpu_info as jax_tpu_info  # noqa: E402
# JAX's device-mesh orderings per TPU device kind, kept off the CPU devices a simulated TPU
# names (tpu_info.py).
from jax._src import mesh_utils as jax_mesh_utils  # noqa: E402
# shard_map's cache of a mesh's manual abstract mesh (which holds the chip a kernel is told
# about): cleared when the simulated TPU changes (tpu_info.py).
from jax._src import shard_map as jax_shard_map  # noqa: E402
# Whether JAX's backends have started, and where every compilation goes: a process forked
# after they started cannot compile (it hangs), so there it is refused (children.py).
from jax._src import xla_bridge  # noqa: E402
from jax._src import compiler  # noqa: E402


def xla_client() -> ModuleType:
    """The XLA client, for the engine's own CPU client (engine/runtime/backend.py)."""
    from jax._src.lib import xla_client as module

    return module



def backends_started() -> bool:
    """Whether JAX's backends have started, read without JAX's lock: children.py asks in
    a process just forked, where another thread of the parent may have held that lock."""
    return bool(xla_bridge._backends)


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


__all__ = [
    "backends_started", "callback_module", "compiler", "dispatch", "ffi", "hlo_interpreter",
    "jax_mesh_utils", "jax_shard_map", "jax_tpu_info", "mlir", "mosaic_dialect",
    "pallas_call_module", "pjit", "sharding_impls", "tpu_interpret_params",
    "tpu_interpreter", "xla_bridge", "xla_client",
]
