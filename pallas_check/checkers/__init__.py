"""Checkers turn engine events into findings while the kernel runs (one module each).

`CHECKERS` answers the engine's events (`engine/events.py`'s `Checkers` protocol); the
session hands it to the engine, which imports no checker.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from pallas_check.checkers import (assertions, bounds, deadlock, lowering, pipeline, semaphores,
                                 uninit)
from pallas_check.checkers.races import RaceChecker
from pallas_check.engine import events
from pallas_check.findings import Finding, KernelInfo


class _Checkers:
    """The checkers behind the engine's events (see engine/events.py)."""

    def masked_out_of_bounds(self, region: Any, mask: np.ndarray) -> bool:
        return bounds.masked_oob(region, mask)

    def access_out_of_bounds(self, state: Any, ctx: Any, region: Any, operation: str,
                             frames: tuple) -> Finding:
        return bounds.access_finding(state, ctx, region, operation, frames)

    def block_out_of_bounds(self, ctx: Any, op: Any, block_index: tuple,
                            bad_dims: list[int], frames: tuple) -> Finding:
        return bounds.block_finding(ctx, op, block_index, bad_dims, frames)

    def revisit_lost(self, state: Any, lost: Any) -> Finding:
        return pipeline.lost_values_finding(state, lost)

    def device_out_of_bounds(self, state: Any, ctx: Any, device: str, what: str,
                             frames: tuple) -> Finding:
        return bounds.device_finding(state, ctx, device, what, frames)

    def deadlocked(self, state: Any, found: Any, ctx: Any) -> Finding:
        return deadlock.deadlock_finding(state, found, ctx)

    def signal_not_remote(self, state: Any, ctx: Any, semaphore: str, named: str,
                          signaller: str, frames: tuple) -> Finding:
        return semaphores.signal_not_remote_finding(state, ctx, semaphore, named, signaller,
                                                    frames)

    def call_ended(self, state: Any, ctx: Any) -> None:
        semaphores.semaphore_findings(state, ctx)

    def dmas_not_waited(self, state: Any) -> list[Finding]:
        return semaphores.dma_not_waited_findings(state)

    def semaphores_never_taken(self, values: list) -> list[Finding]:
        """At the script's end: semaphores a call returned that no later call took."""
        return semaphores.never_taken_findings(values)

    def output_unwritten(self, state: Any, buffer: Any) -> None:
        uninit.unwritten_finding(state, buffer)

    def outputs_of_two_fills(self, output_names: list[str], state: Any,
                             outputs: list[np.ndarray], other_outputs: list[np.ndarray],
                             written: list[np.ndarray | None], kernel: KernelInfo,
                             call_index: int) -> list[Finding]:
        return uninit.uninit_findings(output_names, state, outputs, other_outputs, written,
                                      kernel, call_index)

    def dma_address_of_two_fills(self, state: Any, other: Any) -> list[Finding]:
        return uninit.address_findings(state, other)

    def check_failed(self, state: Any, ctx: Any, message: str, check: str,
                     frames: tuple) -> Finding:
        return assertions.check_failed_finding(state, ctx, message, check, frames)

    def race_detector(self, make_finding: Callable[..., Finding],
                      add: Callable[[Finding], None]) -> RaceChecker:
        return RaceChecker(make_finding, add)

    def not_lowered(self, kernel: KernelInfo, call_index: int, error: Any) -> Finding:
        return lowering.not_lowered_finding(kernel, call_index, error)


class RaceCounting(_Checkers):
    """The checkers of ONE call with races on, keeping what its race checking covered for
    the call's summary (CallSummary.races): the accesses checked and the longest history
    one buffer held, over every simulation of the call (schedules, the second fill,
    revisit re-runs). They run one after the other, so a detector is done once the next
    is made: only its numbers are kept, not its history."""

    def __init__(self) -> None:
        self._accesses = 0
        self._longest = 0
        self._current: RaceChecker | None = None

    def race_detector(self, make_finding: Callable[..., Finding],
                      add: Callable[[Finding], None]) -> RaceChecker:
        self._tally()
        self._current = RaceChecker(make_finding, add)
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


CHECKERS = _Checkers()
events.set_default_checkers(CHECKERS)
