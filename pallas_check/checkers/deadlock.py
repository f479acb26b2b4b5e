"""Deadlocks: every blocked actor, the semaphore it waits on, the value it wants and the
count now (from the scheduler, which ends the call instead of hanging); at a SparseCore's
subcore barrier, who waits there and who never arrives (and why)."""

from __future__ import annotations

from pallas_check.checkers.base import Checker
from pallas_check.engine.events import Deadlocked, StalledBarrier
from pallas_check.engine.memory.buffer import MemorySpace
from pallas_check.findings.finding import Access, Finding, FindingKind


class DeadlockChecker(Checker):
    def on_deadlocked(self, event: Deadlocked) -> None:
        self.sink.emit(deadlock_finding(self, event))


def deadlock_finding(checker: Checker, deadlock: Deadlocked) -> Finding:
    parts = []
    accesses = []
    for wait in deadlock.blocked:
        if not wait.barrier:  # (those at a subcore barrier are told per barrier below)
            parts.append(f"{wait.actor} waits in a {wait.what} for {wait.semaphore} to reach"
                         f" {wait.wanted} (it is {wait.current})")
        accesses.append(Access("wait", wait.actor, wait.buffer, MemorySpace.SEMAPHORE,
                               wait.index_range, wait.frames, deadlock.grid_point))
    signal = ", and nothing can signal it" if parts else ""
    parts += [barrier_part(barrier) for barrier in deadlock.barriers]
    first = deadlock.blocked[0] if deadlock.blocked else None
    return Finding(
        kind=FindingKind.DEADLOCK,
        # (no "deadlock: " in front: every report already heads it with its kind)
        message="; ".join(parts) + signal,
        kernel=checker.call.kernel, call_index=checker.call.call_index,
        grid_point=deadlock.grid_point, actor=first.actor if first else "",
        buffer=first.buffer if first else "", memory_space=MemorySpace.SEMAPHORE,
        index_range=first.index_range if first else None,
        frames=first.frames if first else (), accesses=tuple(accesses),
    )


def barrier_part(barrier: StalledBarrier) -> str:
    """Who waits at a SparseCore's subcore barrier, and who never arrives there (and why:
    it finished, or it waits on something else)."""
    absent = []
    for subcore in barrier.absent:
        if subcore.finished:
            why = "it finished without reaching the barrier"
        elif subcore.waits_in:
            why = f"it waits in a {subcore.waits_in}"
        else:
            why = "it never reached the barrier"
        name = subcore.actor
        who = (name if name.endswith(f"subcore {subcore.subcore}")
               else f"subcore {subcore.subcore} ({name})")
        absent.append(f"{who} never arrives: {why}")
    line = f" at line {barrier.line}" if barrier.line is not None else ""
    return (f"{len(barrier.waiting)} of {barrier.members} subcores of {barrier.where} wait at"
            f" the subcore barrier{line} ({', '.join(barrier.waiting)}), and "
            + "; ".join(absent))
