"""The one place pallas-check touches JAX's private modules (`jax._src`).

Pallas has no stable plugin API: intercepting `pallas_call`, reading its GridMapping and the
kernel's jaxpr, and evaluating Pallas, Mosaic and state primitives all need JAX internals.
Each private module is imported here once, with what it is for; the rest of pallas-check
imports these names from this package. When JAX moves something, this file (and the code
using the name) is where to look. Tested with jax 0.10.2 (pinned in pyproject.toml).

Importing this package imports JAX: modules that must run before JAX starts (the command
line, which sets XLA_FLAGS for --devices) import it lazily.
"""

from __future__ import annotations

from types import ModuleType

# Jaxprs, equations, vars, literals, primitives, avals; `jaxpr_as_fun`, `get_axis_env`.
from jax._src import core as jax_core
# A jaxpr's integer literal (an int carrying its dtype): an index as cacheable as an int.
from jax._src.literals import TypedInt
# Python host callbacks emitted straight into a lowered module (intercept.py).
from jax._src import callback as callback_module
# Runtime tokens of side-effecting computations, settled after our callback failed.
from jax._src import dispatch
# Lowering of XLA FFI custom calls (hostcall.py's lend / give_back).
from jax._src import ffi
# The sharding context of a lowering: one device or several (intercept.py).
from jax._src import sharding_impls
# The nested-jit primitive (`pjit_p`) inside kernels (engine/rules/control.py); the
# dispatch of a top-level jitted call (`_pjit_call_impl_python`, `_get_fastpath_data`),
# hooked by outer.py to know the jitted call around a kernel.
from jax._src import pjit
# MLIR lowering registry: where the pallas_call lowering is patched (intercept.py), and
# whether a primitive has a CPU lowering (engine/jaxpr/program.py).
from jax._src.interpreters import mlir
# lax internals: control-flow primitives (cond, while, scan) and axis_index, evaluated by our
# rules (engine/rules/control.py).
from jax._src.lax import control_flow as lax_control_flow
from jax._src.lax import parallel as lax_parallel
# The pallas_call primitive and its lowering (intercept.py); GridMapping, BlockSpec dims,
# semaphore dtypes, dynamic grid dims (engine/call/describe.py, engine/rules/dma.py).
from jax._src.pallas import core as pallas_core
from jax._src.pallas import pallas_call as pallas_call_module
from jax._src.pallas import primitives as pallas_primitives
# Mosaic (TPU) primitives: DMAs, semaphores, PRNG, barrier (engine/rules/), and
# which chip a kernel is told it runs on (tpu_info.py).
from jax._src.pallas.mosaic import primitives as mosaic_primitives
from jax._src.pallas.mosaic import tpu_info as jax_tpu_info
# JAX's device-mesh orderings per TPU device kind, kept off the CPU devices a simulated TPU
# names (tpu_info.py).
from jax._src import mesh_utils as jax_mesh_utils
# shard_map's cache of a mesh's manual abstract mesh (which holds the chip a kernel is told
# about): cleared when the simulated TPU changes (tpu_info.py).
from jax._src import shard_map as jax_shard_map
# SparseCore primitives (plsc): vector ops, barrier, parallel_loop (engine/rules/sparsecore.py).
from jax._src.pallas.mosaic import sc_primitives
# SparseCore: `Indices` (a gather/scatter DMA's filtered index vector; engine/dma/indirect.py,
# engine/jaxpr/mosaic_limits.py); the meshes (VectorSubcoreMesh / ScalarSubcoreMesh) read by
# engine/call/describe.py.
from jax._src.pallas.mosaic import sc_core
# The mpmd_map primitive `pl.kernel` over a SparseCore mesh traces to: tpu_compile/compiler.py
# binds it to compile through the SparseCore lowering.
from jax._src.pallas import mpmd
# Ref state: indexers (NDIndexer, Slice), ref transforms and types, get/swap/addupdate
# primitives, and discharge of index maps that read scalar-prefetch refs.
from jax._src.state import discharge as state_discharge
from jax._src.state import indexing as state_indexing
from jax._src.state import primitives as state_primitives
from jax._src.state import types as state_types
# `pl.debug_check`'s primitive (`check_p`) and the error pytree its operands flatten
# (engine/rules/debug.py evaluates the kernel's own assertions).
from jax._src import checkify
# Whether JAX's backends have started, and where every compilation goes: a process forked
# after they started cannot compile (it hangs), so there it is refused (children.py).
from jax._src import xla_bridge
from jax._src import compiler
# `pl.debug_print`'s primitive (`debug_print_p`), whose params carry the format string
# (engine/rules/debug.py formats each print with the core that printed it).
from jax._src import debugging


def xla_client() -> ModuleType:
    """The XLA client, for the engine's own CPU client (engine/runtime/backend.py)."""
    from jax._src.lib import xla_client as module

    return module


def custom_derivatives() -> ModuleType | None:
    """custom_jvp / custom_vjp call primitives inside kernels (None if JAX moved them)."""
    try:
        from jax._src import custom_derivatives as module
    except ImportError:  # pragma: no cover - layout of another JAX version
        return None
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
    "backends_started", "callback_module", "checkify", "compiler", "custom_derivatives", "debugging", "dispatch", "ffi", "hlo_interpreter",
    "jax_core", "jax_mesh_utils", "jax_shard_map", "jax_tpu_info", "lax_control_flow", "lax_parallel", "mlir",
    "mosaic_dialect",
    "mosaic_primitives", "mpmd", "pallas_call_module", "pallas_core", "pallas_primitives", "pjit",
    "sc_core", "sc_primitives", "sharding_impls", "state_discharge", "state_indexing", "state_primitives", "state_types",
    "tpu_interpret_params", "tpu_interpreter", "xla_bridge", "xla_client",
]
