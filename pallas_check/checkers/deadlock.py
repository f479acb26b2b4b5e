"""Deadlocks: every blocked actor, the semaphore it waits on, the value it wants and the
count now (from the scheduler, which ends the call instead of hanging)."""

from __future__ import annotations

from pallas_check.checkers.base import Checker
from pallas_check.engine.events import Deadlocked
from pallas_check.engine.memory.buffer import MemorySpace
from pallas_check.findings import Access, Finding, FindingKind


class DeadlockChecker(Checker):
    def on_deadlocked(self, event: Deadlocked) -> None:
        self.sink.emit(deadlock_finding(self, event))


def deadlock_finding(checker: Checker, deadlock: Deadlocked) -> Finding:
    parts = []
    accesses = []
    for wait in deadlock.blocked:
        parts.append(f"{wait.actor} waits in a {wait.what} for {wait.semaphore} to reach"
                     f" {wait.wanted} (it is {wait.current})")
        accesses.append(Access("wait", wait.actor, wait.buffer, MemorySpace.SEMAPHORE,
                               wait.index_range, wait.frames, deadlock.grid_point))
    first = deadlock.blocked[0] if deadlock.blocked else None
    return Finding(
        kind=FindingKind.DEADLOCK,
        message="deadlock: " + "; ".join(parts) + ", and nothing can signal it",
        kernel=checker.call.kernel, call_index=checker.call.call_index,
        grid_point=deadlock.grid_point, actor=first.actor if first else "",
        buffer=first.buffer if first else "", memory_space=MemorySpace.SEMAPHORE,
        index_range=first.index_range if first else None,
        frames=first.frames if first else (), accesses=tuple(accesses),
    )
