"""The kernel author's own assertions (`pl.debug_check`) that failed: one finding each,
merged over the grid steps (and calls) where the same check fails, with a count."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pallas_check.findings import Finding, FindingKind, SourceFrame

if TYPE_CHECKING:  # only for annotations
    from pallas_check.engine.call.state import CallState, CoreContext


def check_failed_finding(state: CallState, ctx: CoreContext, message: str, check: str,
                         frames: tuple[SourceFrame, ...]) -> Finding:
    """`message`: the check's message with its values; `check`: as written, which tells
    two checks on one line apart (the merge key), whatever values each step formats."""
    where = f"at grid point {tuple(ctx.grid_point)} " if ctx.grid_point else ""
    on = f"{where}on device {ctx.device_id} core {ctx.core_id}"
    return Finding(
        kind=FindingKind.CHECK_FAILED,
        message=f"pl.debug_check failed: {message} ({on})",
        kernel=state.kernel, call_index=state.call_index, grid_point=ctx.grid_point,
        actor=ctx.actor, frames=frames,
        details={"merge": check, "check": message, "device": ctx.device_id,
                 "core": ctx.core_id},
    )
