"""Deadlocks: every blocked actor, the semaphore it waits on, the value it wants and the
count now (from the scheduler, which ends the call instead of hanging)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pallas_check.findings import Access, Finding, FindingKind, IndexRange
from pallas_check.engine.memory.buffer import MemorySpace
from pallas_check.engine.runtime.barrier import SubcoreBarrier
from pallas_check.engine.runtime.scheduler import Deadlock

if TYPE_CHECKING:  # only for annotations
    from pallas_check.engine.call.state import CallState, CoreContext


def deadlock_finding(state: CallState, deadlock: Deadlock, ctx: CoreContext) -> Finding:
    parts = []
    accesses = []
    barriers: dict[int, tuple[SubcoreBarrier, list[str]]] = {}
    for actor, wait in deadlock.blocked:
        current = wait.current() if callable(wait.current) else wait.current
        if isinstance(current, SubcoreBarrier):
            barriers.setdefault(id(current), (current, []))[1].append(actor)
        else:
            parts.append(f"{actor} waits in a {wait.what} for {wait.semaphore} to reach"
                         f" {wait.wanted} (it is {current})")
        buffer, rng = wait_target(wait)
        accesses.append(Access("wait", actor, buffer, MemorySpace.SEMAPHORE, rng,
                               wait.frames, ctx.grid_point))
    signal = ", and nothing can signal it" if parts else ""
    parts += [barrier_part(state, barrier, actors) for barrier, actors in barriers.values()]
    first = deadlock.blocked[0][1] if deadlock.blocked else None
    buffer, rng = wait_target(first) if first else ("", None)
    return Finding(
        kind=FindingKind.DEADLOCK,
        message="deadlock: " + "; ".join(parts) + signal,
        kernel=state.kernel, call_index=state.call_index, grid_point=ctx.grid_point,
        actor=deadlock.blocked[0][0] if deadlock.blocked else "",
        buffer=buffer, memory_space=MemorySpace.SEMAPHORE, index_range=rng,
        frames=first.frames if first else (), accesses=tuple(accesses),
    )


def barrier_part(state: CallState, barrier: SubcoreBarrier, waiting: list[str]) -> str:
    """Who waits at a SparseCore's subcore barrier, and who never arrives there (and why:
    it finished, or it waits on something else)."""
    actors = {a.name: a for a in state.scheduler.actors} if state.scheduler else {}
    absent = []
    for subcore, name in barrier.missing():
        actor = actors.get(name)
        if actor is not None and actor.done:
            why = "it finished without reaching the barrier"
        elif actor is not None and actor.waiting is not None:
            why = f"it waits in a {actor.waiting.what} ({actor.waiting.semaphore})"
        else:
            why = "it never reached the barrier"
        who = name if name.endswith(f"subcore {subcore}") else f"subcore {subcore} ({name})"
        absent.append(f"{who} never arrives: {why}")
    line = ""
    if barrier.arrived:
        frames = next(iter(barrier.arrived.values()))
        line = f" at line {frames[0].line}" if frames else ""
    return (f"{len(waiting)} of {len(barrier.members)} subcores of {barrier.where} wait at"
            f" the subcore barrier{line} ({', '.join(waiting)}), and "
            + "; ".join(absent))


def wait_target(wait: Any) -> tuple[str, IndexRange | None]:
    """The semaphore buffer a wait is on (the kernel's own name) and its index in it."""
    if getattr(wait, "cell", None) is None:
        return wait.semaphore, None
    buf, idx = wait.cell
    return buf.name, tuple((int(i), int(i) + 1) for i in idx) or None
