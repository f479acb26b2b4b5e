"""The kernel author's own assertions (`pl.debug_check`) that failed: one finding each,
merged over the grid steps (and calls) where the same check fails, with a count."""

from __future__ import annotations

from pallas_check.checkers.base import Checker
from pallas_check.engine.events import CheckFailed
from pallas_check.findings.finding import Finding, FindingKind


class AssertionChecker(Checker):
    def on_check_failed(self, event: CheckFailed) -> None:
        self.sink.emit(check_failed_finding(self, event))


def check_failed_finding(checker: Checker, e: CheckFailed) -> Finding:
    """`message`: the check's message with its values; `check`: as written, which tells
    two checks on one line apart (the merge key), whatever values each step formats."""
    w = e.where
    at = f"at grid point {tuple(w.grid_point)} " if w.grid_point else ""
    on = f"{at}on device {w.device} core {w.core}"
    return Finding(
        kind=FindingKind.CHECK_FAILED,
        message=f"pl.debug_check failed: {e.message} ({on})",
        kernel=checker.call.kernel, call_index=checker.call.call_index,
        grid_point=w.grid_point, actor=w.actor, frames=w.frames,
        merge=e.check, details={"check": e.message, "device": w.device, "core": w.core},
    )
