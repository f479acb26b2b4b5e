"""Kernels Mosaic does not lower: a `compile-error` finding at the user's line, found by the
simulation itself (no `--compile` needed). The call never runs on a TPU, so the engine
skips it (engine/call/explore.py `_skipped`)."""

from __future__ import annotations

from pallas_check.checkers.base import Checker
from pallas_check.engine.events import CallSkipped
from pallas_check.findings.finding import Finding, FindingKind


class LoweringChecker(Checker):
    def on_call_skipped(self, event: CallSkipped) -> None:
        """What Mosaic refuses (raised by engine/jaxpr/mosaic_limits.py), as the finding."""
        self.sink.emit(Finding(
            kind=FindingKind.COMPILE_ERROR,
            message=f"{event.message}; the call is skipped: its outputs are left never"
                    f" written (the fill), an output aliased to an input keeps the input",
            kernel=self.call.kernel, call_index=self.call.call_index, buffer=event.buffer,
            memory_space=event.memory_space, frames=event.frames,
            details={"operation": event.operation, "mosaic": event.mosaic}, skipped=True,
        ))
