"""Deadlocks: every blocked actor, the semaphore it waits on, the value it wants and the
count now (from the scheduler, which ends the call instead of hanging); at a SparseCore's
subcore barrier, who waits there and who never arrives (and why); on a chip that runs a
TensorCore mesh's cores one after another, the cores that never started, and why the kernel
hangs there (`serial_help`)."""

from __future__ import annotations

from pallas_check.checkers.base import Checker
from pallas_check.engine.events import Deadlocked, StalledBarrier
from pallas_check.engine.verdicts import SerialCores
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
    serial = deadlock.serial
    if serial is not None and serial.not_started:
        signal += (f"; {' and '.join(serial.not_started)} never started (on a"
                   f" {serial.tpu} the mesh's cores run one after another)")
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
        help=serial_help(serial) if serial is not None else None,
    )


def serial_help(serial: SerialCores) -> str | None:
    """Why a kernel over a TensorCore mesh hangs on a chip with one TensorCore
    (engine/call/serial.py): its cores run one after another there, and what it sends to
    another core of the mesh never arrives; it can work on a chip with two. None when the
    one-after-another run played no part (no core left unstarted, nothing lost)."""
    if not serial.not_started and not serial.lost:
        return None
    lost = ""
    if serial.lost:
        first = serial.lost[0]
        line = f" at line {first.frames[0].line}" if first.frames else ""
        lost = (f" (the {first.what}{line} from {first.actor} to core {first.core} never"
                f" arrived)")
    return (f"a TPU {serial.tpu} has one TensorCore: the {serial.cores} cores of the"
            f" TensorCore mesh run one after another on it, core 0 first, and a signal or DMA"
            f" to another core of the mesh never reaches that core{lost}; on a chip with two"
            f" TensorCores (v4, v5p, v7x) the kernel can work: check it with `--tpu v7x`, or"
            f" make it a single-core design")


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
