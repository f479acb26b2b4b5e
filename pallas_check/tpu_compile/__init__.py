"""Compile intercepted pallas_calls for real TPU generations on a CPU (`--compile`).

libtpu gives compile-only TPU devices (`jax.experimental.topologies`); a call re-bound
under `jax.jit(...).lower(<ShapeDtypeStructs on that device>).compile()`, with that device
as JAX's default device, goes through the Pallas TPU lowering, Mosaic and XLA:TPU exactly
as on a TPU host. What fails becomes a `compile-error` or `vmem-exceeded` finding; what
compiles reports its VMEM footprint.

- `toolchain.py` — is libtpu there, its start-up chatter kept off the terminal, one
  compile-only device per generation (cached per process).
- `footprint.py` — a call's VMEM allocations by the kernel's own names (blocks, scratch).
- `diagnose.py` — a compiler error as one sentence, its code, and the user's line
  (`mlirloc.py` maps Mosaic's failing operation back to its source location).
- `compiler.py` — one call for one generation: the outcome, cached per run.
- `remote.py` — the compile itself in a worker process, so that libtpu's compiler
  aborting on a kernel is a finding, not the end of pallas-check.
- `stage.py` — what `run --compile`, `compile` and the pytest plugin share: calls
  recorded while the script runs, compiled after it, turned into findings.
"""
