"""process/watchdog.py: the thread that keeps a run stoppable ends with the run."""

from __future__ import annotations

import threading

from pallas_check.process import watchdog as watchdog_module
from pallas_check.process.watchdog import Watchdog


def test_the_watchdog_ends_when_the_run_does_not_when_it_next_looks(monkeypatch):
    """The thread waits for a signal LISTEN_S at a time; leaving the watchdog wakes it at
    once. Here it would wait a minute: were it not woken, it would still be alive after
    `__exit__`'s two-second join (before, every run ended up to 0.25 s late)."""
    monkeypatch.setattr(watchdog_module, "LISTEN_S", 60.0)
    assert threading.current_thread() is threading.main_thread()  # (the signal socket)
    looked = threading.Event()

    def calls_in_flight() -> int:
        looked.set()
        return 0

    dog = Watchdog(lambda reason: False, calls_in_flight=calls_in_flight, stall_s=1.0)
    with dog:
        assert dog._thread is not None and dog._reader is not None
    assert dog._thread is not None and not dog._thread.is_alive()
    assert not looked.is_set()  # (it was woken inside its wait, not after it)
