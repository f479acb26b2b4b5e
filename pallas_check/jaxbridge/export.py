"""A traced program carried to another process and compiled there (the compiled tier's
bounded builds: engine/runtime/bounded_compile.py).

Why `jax.export` and pickle: an XLA compile cannot be interrupted inside a thread, so a
compile that may overrun its budget runs in a child process, which cannot retrace the
kernel (a pallas_call's jaxpr does not pickle). `jax.export` lowers the traced program to
a StableHLO module with its argument and result trees; `Exported.serialize` needs the
`flatbuffers` package, which JAX does not install, so the `Exported` itself is pickled,
less its vjp closure (a local function: never needed to compile). The child compiles it
through `jax.jit(exported.call)`; its executable takes the same arguments and returns the
same tree as the parent's own compile would, and is read back through the disk cache.

The chip's compile (tpu_compile/remote.py) carries a call the same way to a worker that
compiles it for a compile-only TPU device: there the module is exported for the TPU (the
Pallas TPU lowering runs in the parent, with the generation's device as JAX's default
device, as when the parent compiles), and `Exported.serialize` could not carry it anyway:
its flatbuffer has no dtype for a pallas_call's semaphore operands (`dma_sem`), which a
call returning DMA semaphores to the next call has.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pickle
from typing import Any, Mapping, Sequence

import jax
from jax._src import config as _config


def exported(jitted: Any, avals: Sequence[jax.ShapeDtypeStruct]) -> tuple[bytes, str]:
    """`jitted` (a `jax.jit` function, traced on `avals` before: its trace is reused)
    exported for the CPU, as bytes for `compile_exported`, and its module's text with its
    signature (what the disk cache keys the executable by)."""
    found = jax.export.export(jitted, platforms=["cpu"])(*avals)
    signature = repr((found.in_avals, found.out_avals, found.in_tree, found.out_tree))
    blob = pickle.dumps(dataclasses.replace(found, _get_vjp=None))
    return blob, signature + "\n" + found.mlir_module()


def exported_for_tpu(jitted: Any, args: Sequence[jax.ShapeDtypeStruct]) -> bytes:
    """`jitted` exported for the TPU on `args` (placed on compile-only devices, under that
    generation's device as JAX's default device), as bytes for `lowered_on_tpu`.

    Without JAX's forward-compatibility rules: an export lowers Pallas kernels for an
    older TPU runtime by default (an older Mosaic serialization, no transposed-operand
    hint on matmuls, `reciprocal` without `full_range`), which is not what a TPU host
    compiles for `jax.jit`; with them off, the kernel in the module is the plain lowering's
    (tests/jaxbridge/test_export.py)."""
    return exported_for_tpu_keyed(jitted, args)[0]


def exported_for_tpu_keyed(jitted: Any, args: Sequence[jax.ShapeDtypeStruct]
                           ) -> tuple[bytes, str]:
    """`exported_for_tpu`, and a text naming what the TPU compiler is given (a digest of
    the serialized module with the signature and placement): equal for the same program
    in any process, so it keys what the compiler said of it (tpu_compile/outcome_cache.py)
    without lowering the call a second time."""
    with _config.export_ignore_forward_compatibility(True):
        found = jax.export.export(jitted, platforms=["tpu"])(*args)
    digest = hashlib.sha256(bytes(found.mlir_module_serialized)).hexdigest()
    signature = repr((found.in_avals, found.out_avals, found.in_shardings_hlo,
                      found.out_shardings_hlo, found.nr_devices, found.platforms))
    return (pickle.dumps(dataclasses.replace(found, _get_vjp=None)),
            f"exported {digest}\n{signature}")


def lowered_on_tpu(blob: bytes, sharding: Any) -> jax.stages.Lowered:
    """A call `exported_for_tpu` made, lowered in this process on ShapeDtypeStructs with
    `sharding` (a compile-only device's, or a mesh of them): ready for `.compile()`."""
    found: Any = pickle.loads(blob)
    place: Any = jax.ShapeDtypeStruct  # (untyped in JAX)
    return jax.jit(found.call).lower(*[place(a.shape, a.dtype, sharding=sharding)
                                       for a in found.in_avals])


def compile_exported(blob: bytes, options: Mapping[str, str | bool] | None) -> jax.stages.Compiled:
    """A program `exported` made, compiled for this process's CPU with `options`."""
    found: Any = pickle.loads(blob)
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype)  # type: ignore[no-untyped-call]
             for a in found.in_avals]
    lowered = jax.jit(found.call).lower(*avals)
    return lowered.compile(compiler_options=dict(options) if options else None)
