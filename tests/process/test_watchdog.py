"""process/watchdog.py: the thread that keeps a run stoppable ends with the run, and hears
only the signals of its own process."""

from __future__ import annotations

import threading

import pytest

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


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # (the child runs no JAX)
def test_a_signal_a_forked_child_gets_does_not_reach_the_owners_watchdog():
    """The child of a fork inherits the socket the C-level signal handler writes a signal's
    number to. The watchdog detaches it while the child is made, so a stop the child gets
    before it undoes the run (Pool.terminate's SIGTERM to a worker it just forked) is not
    read by the owner's watchdog as the owner's own stop (the run ended "interrupted",
    exit 3). Here the child, with a Python handler for SIGTERM as a run's child has,
    signals itself and exits; the watchdog then looks twice more, and has not fired."""
    import os
    import signal

    fired = threading.Event()
    decided = threading.Event()  # it fired, or looked twice after the child ended
    looks = [0]
    child_done = threading.Event()

    def emergency(reason: str) -> bool:
        fired.set()
        decided.set()
        return False  # (the test process goes on)

    def calls_in_flight() -> int:
        if child_done.is_set():
            looks[0] += 1
            if looks[0] >= 2:
                decided.set()
        return 0

    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        with Watchdog(emergency, calls_in_flight=calls_in_flight, grace_s=0.0, stall_s=1e9):
            pid = os.fork()
            if pid == 0:
                os.kill(os.getpid(), signal.SIGTERM)
                os._exit(0)
            os.waitpid(pid, 0)
            child_done.set()
            assert decided.wait(timeout=120), "the watchdog never looked"
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert not fired.is_set()
