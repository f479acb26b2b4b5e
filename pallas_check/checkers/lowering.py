"""Kernels Mosaic does not lower: a `compile-error` finding at the user's line, found by the
simulation itself (no `--compile` needed). The call never runs on a TPU, so the engine
skips it (engine/call/explore.py `_skipped`)."""

from __future__ import annotations

from pallas_check.engine.jaxpr.mosaic_limits import NotLowered
from pallas_check.findings import Finding, FindingKind, KernelInfo


def not_lowered_finding(kernel: KernelInfo, call_index: int, error: NotLowered) -> Finding:
    """What Mosaic refuses (`error`, raised by engine/jaxpr/mosaic_limits.py), as the finding."""
    return Finding(
        kind=FindingKind.COMPILE_ERROR,
        message=f"{error.message}; the call is skipped: its outputs are left never written"
                f" (the fill), an output aliased to an input keeps the input",
        kernel=kernel, call_index=call_index, buffer=error.buffer,
        memory_space=error.memory_space, frames=error.frames,
        details={"operation": error.operation, "mosaic": error.mosaic, "skipped": True},
    )
