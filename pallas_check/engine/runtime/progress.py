"""A heartbeat of the engine: when it last made progress (read by the run's watchdog).

The scheduler beats at every step; the watchdog of a run tells a call that is stuck
(no beat for a long time while the call is in flight) from one that is slow.
"""

from __future__ import annotations

import time


_last_beat = time.monotonic()


def beat() -> None:
    """The engine moved: a scheduler step ran, or a call started or ended."""
    global _last_beat
    _last_beat = time.monotonic()


def seconds_since_beat() -> float:
    return time.monotonic() - _last_beat


class GridSteps:
    """How far the grid walk of one call has got, for a progress line (deliver/progress_line.py).

    The pipeline adds one to `done` per grid step and core: an int increment, nothing
    else, so a long call pays nothing measurable; the reader polls it from another thread
    a few times a second. A call simulated more than once (schedules, the re-run with the
    other fill, perturbed re-runs) starts over in `start`, which counts the passes.
    """

    __slots__ = ("call_index", "kernel", "done", "total", "passes", "started")

    def __init__(self, call_index: int, kernel: str) -> None:
        self.call_index, self.kernel = call_index, kernel
        self.done = 0
        self.total = 0
        self.passes = 0
        self.started = time.monotonic()

    def start(self, total: int) -> None:
        """A simulation of the call begins: `total` grid steps, all devices and cores."""
        self.done, self.total = 0, total
        self.passes += 1
        self.started = time.monotonic()


# Calls being simulated now, by call index (the engine adds them, the session drops them).
_live: dict[int, GridSteps] = {}


def grid_steps(call_index: int, kernel: str) -> GridSteps:
    """The counter of a call, made at its first simulation and kept across its passes."""
    steps = _live.get(call_index)
    if steps is None or steps.kernel != kernel:
        steps = _live[call_index] = GridSteps(call_index, kernel)
    return steps


def call_ended(call_index: int) -> None:
    _live.pop(call_index, None)


def live_calls() -> list[GridSteps]:
    """The calls in flight, oldest first (a snapshot: safe from another thread)."""
    return sorted(list(_live.values()), key=lambda s: s.call_index)
