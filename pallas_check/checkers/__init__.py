"""Checkers turn engine events into findings while the kernel runs (one module each).

Each checker is a listener (engine/events.py `Listener`): it overrides the `on_...` methods
of the events it takes and emits its findings into the call's sink. `CHECKERS` makes a
call's listeners (engine/events.py `Checking`); the session hands it to the engine, which
imports no checker.

A new checker: a `Checker` subclass in a module here, and its class in `_CHECKERS`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pallas_check.checkers.assertions import AssertionChecker
from pallas_check.checkers.base import Checker
from pallas_check.checkers.bounds import BoundsChecker
from pallas_check.checkers.deadlock import DeadlockChecker
from pallas_check.checkers.compile_error import LoweringChecker
from pallas_check.checkers.mxu import MxuChecker
from pallas_check.checkers.random import RandomChecker
from pallas_check.checkers.revisits import RevisitChecker
from pallas_check.checkers.races import RaceChecker
from pallas_check.checkers.semaphores import SemaphoreChecker, never_taken_findings
from pallas_check.checkers.uninit import UninitChecker
from pallas_check.engine import events
from pallas_check.findings.finding import Finding

if TYPE_CHECKING:  # only for annotations
    from pallas_check.engine.call.carried import SemaphoreValue

# The checkers every simulation of a call has (RaceChecker too, with races on).
_CHECKERS: tuple[type[Checker], ...] = (
    BoundsChecker, AssertionChecker, DeadlockChecker, SemaphoreChecker, UninitChecker,
    RevisitChecker, LoweringChecker, MxuChecker, RandomChecker)


class Checkers:
    """The checkers behind the engine's events: a fresh set for each simulation."""

    def listeners(self, call: events.CallFacts,
                  sink: events.FindingSink) -> tuple[events.Listener, ...]:
        made: tuple[events.Listener, ...] = tuple(kind(call, sink) for kind in _CHECKERS)
        if call.races:
            made += (self.race_checker(call, sink),)
        return made

    def race_checker(self, call: events.CallFacts, sink: events.FindingSink) -> RaceChecker:
        return RaceChecker(call, sink)

    def semaphores_never_taken(self, values: list[SemaphoreValue]) -> list[Finding]:
        """At the script's end: semaphores a call returned that no later call took."""
        return never_taken_findings(values)


class RaceCounting(Checkers):
    """The checkers of ONE call with races on, keeping what its race checking covered for
    the call's summary (CallSummary.races): the accesses checked and the longest history
    one buffer held, over every simulation of the call that reports (its schedules; the
    second fill and revisit re-runs check no races, engine/call/state.py). They run one after the other, so a checker is done once the next
    is made: only its numbers are kept, not its history."""

    def __init__(self) -> None:
        self._accesses = 0
        self._longest = 0
        self._current: RaceChecker | None = None

    def race_checker(self, call: events.CallFacts, sink: events.FindingSink) -> RaceChecker:
        self._tally()
        self._current = RaceChecker(call, sink)
        return self._current

    def race_cost(self) -> dict[str, int]:
        """`accesses_checked` and `longest_history` of the call (CallSummary.races)."""
        self._tally()
        return {"accesses_checked": self._accesses, "longest_history": self._longest}

    def _tally(self) -> None:
        if self._current is not None:
            self._accesses += self._current.checked
            self._longest = max(self._longest, self._current.longest_history())
            self._current = None


CHECKERS = Checkers()
events.set_default_checking(CHECKERS)
