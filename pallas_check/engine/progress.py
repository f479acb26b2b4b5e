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
