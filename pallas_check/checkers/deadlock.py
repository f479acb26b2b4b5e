"""Deadlocks: every blocked actor, the semaphore it waits on, the value it wants and the
count now (from the scheduler, which ends the call instead of hanging)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pallas_check.findings import Access, Finding, FindingKind, IndexRange
from pallas_check.engine.memory.buffer import MemorySpace
from pallas_check.engine.runtime.scheduler import Deadlock

if TYPE_CHECKING:  # only for annotations
    from pallas_check.engine.call.state import CallState, CoreContext


def deadlock_finding(state: CallState, deadlock: Deadlock, ctx: CoreContext) -> Finding:
    parts = []
    accesses = []
    for actor, wait in deadlock.blocked:
        current = wait.current() if callable(wait.current) else wait.current
        parts.append(f"{actor} waits in a {wait.what} for {wait.semaphore} to reach"
                     f" {wait.wanted} (it is {current})")
        buffer, rng = wait_target(wait)
        accesses.append(Access("wait", actor, buffer, MemorySpace.SEMAPHORE, rng,
                               wait.frames, ctx.grid_point))
    first = deadlock.blocked[0][1] if deadlock.blocked else None
    buffer, rng = wait_target(first) if first else ("", None)
    return Finding(
        kind=FindingKind.DEADLOCK,
        message="deadlock: " + "; ".join(parts) + ", and nothing can signal it",
        kernel=state.kernel, call_index=state.call_index, grid_point=ctx.grid_point,
        actor=deadlock.blocked[0][0] if deadlock.blocked else "",
        buffer=buffer, memory_space=MemorySpace.SEMAPHORE, index_range=rng,
        frames=first.frames if first else (), accesses=tuple(accesses),
    )


def wait_target(wait: Any) -> tuple[str, IndexRange | None]:
    """The semaphore buffer a wait is on (the kernel's own name) and its index in it."""
    if getattr(wait, "cell", None) is None:
        return wait.semaphore, None
    buf, idx = wait.cell
    return buf.name, tuple((int(i), int(i) + 1) for i in idx) or None
