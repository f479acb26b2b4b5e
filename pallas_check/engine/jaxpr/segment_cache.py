"""A kernel segment's executable, found on disk by what the segment is, before lowering.

Why: the engine compiles each pure segment of a kernel (engine/jaxpr/program.py) to one XLA
program, and a suite's next run reads it back from the disk cache instead of compiling it.
Keyed by the lowered program's text, that read still cost a lowering per segment -- JAX's
MLIR context and the module, about as much as the read itself (a warm suite run: 85 of
the engine's 219 profile samples). Segments are instead keyed by their identity: the
equations as text with every parameter (the key the process already shares compiled
segments under), how they are evaluated (skipped floats, the chip's arithmetic), their
operands' types, JAX's settings that change a lowering (64-bit mode, the default
precision, the partitioner), pallas-check's code (the lowering rules it patches) and, through
disk_cache.key, JAX's and jaxlib's versions, the machine and the compiler options. A
segment the disk does not answer is lowered, compiled and kept under that key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import jax

from pallas_check.engine.runtime import disk_cache
from pallas_check.engine.runtime.backend import engine_device

# XLA's algebraic simplifier ("algsimp") rewrites `x * convert(pred)` into
# `select(pred, x, 0)`, which drops a NaN that the multiplication keeps (NaN * 0 is NaN, as
# on a TPU, where Mosaic multiplies). A kernel that masks a padded edge block by
# multiplying with a 0/1 mask then gives the same output under both fills and its
# dependence on never-written memory vanishes. Segments are compiled without that pass, so
# every value follows IEEE arithmetic as written; the segments are small, and the rest of
# XLA's pipeline (fusion, LLVM without fast math) keeps NaN semantics.
# Nor excess precision: with it XLA:CPU drops `x.astype(bfloat16).astype(float32)` and
# keeps bfloat16 arithmetic in float32, where a v5e rounds each result (hardware/README.md).
SEGMENT_COMPILER_OPTIONS: dict[str, str | bool] = {
    "xla_disable_hlo_passes": "algsimp", "xla_allow_excess_precision": False}


_SETTINGS = ("jax_enable_x64", "jax_default_matmul_precision", "jax_use_shardy_partitioner")


def _settings() -> str:
    """JAX's settings that change how a traced segment is lowered (the chip's arithmetic is
    in the identity)."""
    return repr([getattr(jax.config, name, None) for name in _SETTINGS])


def segment_path(identity: str, avals: list[jax.ShapeDtypeStruct]) -> Path | None:
    """Where the executable of the segment `identity` for `avals` is kept (None: the disk
    cache is off)."""
    types = [(a.shape, str(a.dtype), bool(getattr(a, "weak_type", False))) for a in avals]
    text = "\n".join(("segment", disk_cache.code_digest(), _settings(), repr(types), identity))
    return disk_cache.entry_path(text, SEGMENT_COMPILER_OPTIONS)


class DiskCachedSegment:
    """A segment compiled for its inputs' types on the engine's device, read from the disk
    cache when another process compiled the same segment (a test suite's next run neither
    lowers nor compiles it). Called anywhere else, or with inputs of other types, it is the
    plain jitted function, which compiles what it needs as JAX does."""

    def __init__(self, jitted: Callable[..., list[object]],
                 avals: list[jax.ShapeDtypeStruct], identity: str) -> None:
        self.jitted = jitted
        self.avals = avals
        self.identity = identity
        self.run: Callable[..., list[object]] = self._first

    def __call__(self, *args: object) -> list[object]:
        try:
            return self.run(*args)
        except (TypeError, ValueError):  # inputs of other types or devices than compiled for
            if self.run is self.jitted:
                raise
            self.run = self.jitted
            return self.jitted(*args)

    def _first(self, *args: object) -> list[object]:
        """The first call: compile (or read back) for the engine's device, then run."""
        self.run = self.jitted
        device = engine_device()
        if getattr(jax.config, "jax_default_device", None) is device:
            self._compile(device)
        return self.run(*args)

    def _compile(self, device: jax.Device) -> None:
        try:
            path = segment_path(self.identity, self.avals)
            found = None if path is None else disk_cache.read_entry(path, device)
            if found is not None:
                self.run = found
                return
            lowered = self.jitted.lower(*self.avals)  # type: ignore[attr-defined]
            self.run = lowered.compile() if path is None else disk_cache.compile_to(lowered, path)
        except Exception:  # noqa: BLE001 - JAX compiles (and reports) it as it did
            self.run = self.jitted

    def prepare(self) -> bool:
        """Compile (or read back) now, ahead of the first call (`prepare`); whether it had
        not been."""
        if self.run != self._first:
            return False
        device = engine_device()
        with jax.default_device(device):
            self._compile(device)
        return True
