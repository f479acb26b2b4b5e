"""What a call being simulated has found so far, for a run that stops in the middle of it.

A call's findings reach the session when the call ends. A run stopped inside a long call
(Ctrl-C, SIGTERM, the watchdog) lost them, and the call itself with them: its report said
no call was made. The session hands each call an `InFlight` that the engine keeps up to
date -- the schedules finished and their merged findings, the simulation running now --
so that a partial report lists the call, how far it got and what it found until then.

It is read from another thread (the watchdog's) while the engine runs on: the engine
replaces fields whole and only appends to a simulation's findings, so a reader copies a
consistent enough picture without a lock on the engine's path.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from pallas_check.config import Config
from pallas_check.findings.finding import Finding


class Simulating(Protocol):
    """A schedule's reporting simulation as a partial report reads it (engine/call/
    state.py's CallState): its seed, its findings so far, its grid steps walked."""

    @property
    def config(self) -> Config: ...

    @property
    def findings(self) -> list[Finding]: ...


class InFlight:
    def __init__(self, schedules: int = 1) -> None:
        self.schedules_total = schedules
        self.schedules_done = 0
        # The findings of the schedules finished, merged across schedules as the call's
        # result is (a defect seen under an earlier seed is not reported again), and the
        # merge keys seen in them.
        self.findings: tuple[Finding, ...] = ()
        self.seen: frozenset[tuple[object, ...]] = frozenset()
        self.state: Simulating | None = None  # the schedule running (its reported pass)
        # With --trace: seed -> where that schedule's timeline goes as it is recorded
        # (report/trace.py's writer, whose file a stopped run still closes whole).
        self.trace: Callable[[int], Any] | None = None

    def simulating(self, state: Simulating) -> None:
        """A schedule's reported simulation began (not the re-runs that only compare)."""
        self.state = state

    def schedule_done(self, findings: list[Finding], seen: dict[tuple[object, ...], int],
                      done: int) -> None:
        self.findings, self.seen = tuple(findings), frozenset(seen)
        self.schedules_done = done
        # Its findings are in `findings` now; the state is let go with the schedule (held
        # to the call's end, its objects would be scanned by the collector after it).
        self.state = None

    def findings_so_far(self) -> list[Finding]:
        """The finished schedules' findings, then those of the running one not seen in
        them, each with the seed that replays it."""
        findings = list(self.findings)
        state = self.state
        if state is None:
            return findings
        seed = state.config.seed
        for finding in list(state.findings):
            if finding.merge_key() not in self.seen:
                if finding.seed is None:
                    finding.seed = seed
                findings.append(finding)
        return findings

    def progress(self) -> dict[str, int]:
        """How far the call got: grid steps (all devices and cores) of the simulation
        running, and with several schedules how many finished."""
        steps = getattr(self.state, "steps", None)
        done = {"steps_done": int(getattr(steps, "done", 0)),
                "steps_total": int(getattr(steps, "total", 0))}
        if self.schedules_total > 1:
            done.update(schedules_done=self.schedules_done,
                        schedules_total=self.schedules_total)
        return done
