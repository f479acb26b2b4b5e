"""Keeps a checked run stoppable: Ctrl-C always ends it, and a stuck call ends it too.

Ctrl-C and SIGTERM are alike here (process/interrupts.py). Python runs its signal handlers only
between bytecodes of the main thread; a main thread blocked inside XLA (waiting for a
computation that waits for a host callback) never gets there. The watchdog thread hears
the signal through `signal.set_wakeup_fd`, which the interpreter writes from the C-level
handler whatever the main thread does. If the main thread has not finished the run
`grace_s` seconds after Ctrl-C (or at once on a second Ctrl-C), or a call has been in
flight with no engine progress for `stall_s` seconds, the watchdog calls
`emergency(reason)` -- which writes the partial report -- and ends the process with exit
code 3 (the run was interrupted).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import threading
import time
from typing import Callable

from pallas_check.process import children
from pallas_check.process import interrupts
from pallas_check.deliver.delivery import flush_streams, note
from pallas_check.engine.runtime import progress
from pallas_check.config.exitcodes import ExitCode

_real_exit = os._exit  # a run may wrap os._exit (run/runner.py); the watchdog ends for real
GRACE_S = 3.0
STALL_S = 300.0
LISTEN_S = 0.25  # how long the thread waits for a signal before it looks at the clocks


# The watchdogs entered, innermost last, and whether a fork has the wakeup socket detached.
_watching: list["Watchdog"] = []
_detached = [False]


def _before_fork() -> None:
    """About to fork: no wakeup socket while the child is made. The child inherits the
    socket the C-level signal handler writes to; until it undoes the run
    (children.undone_in_child), a signal it gets (Pool.terminate's SIGTERM to a worker it
    just forked) would be read by the owner's watchdog as the owner's own stop."""
    if _watching and _watching[-1]._writer is not None:
        try:
            signal.set_wakeup_fd(-1)
            _detached[0] = True
        except ValueError:  # (a fork from another thread: the socket stays; the child
            pass  # detaches it first thing, see children._after_fork_in_child)


def _after_fork_in_parent() -> None:
    if _detached[0]:
        _detached[0] = False
        writer = _watching[-1]._writer if _watching else None
        if writer is not None:
            with contextlib.suppress(ValueError, OSError):
                signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)


def _after_fork_in_child() -> None:
    _detached[0] = False  # (the child's wakeup fd is -1 already)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)


class Watchdog:
    def __init__(self, emergency: Callable[[str], bool], calls_in_flight: Callable[[], int],
                 grace_s: float | None = None, stall_s: float | None = None) -> None:
        self._emergency = emergency
        self._calls_in_flight = calls_in_flight
        # Both read now, not when the module loads: a test of a stopped run raises the
        # grace (its report must be the main thread's, however loaded the machine) and
        # lowers the stall.
        self.grace_s = GRACE_S if grace_s is None else grace_s
        self.stall_s = STALL_S if stall_s is None else stall_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reader: socket.socket | None = None
        self._writer: socket.socket | None = None
        self._saved_fd: int | None = None
        self._in_child = children.undone_in_child(self._forget_in_child)

    def __enter__(self) -> "Watchdog":
        self._in_child.__enter__()
        if threading.current_thread() is threading.main_thread():
            self._reader, self._writer = socket.socketpair()
            self._reader.setblocking(False)
            self._writer.setblocking(False)
            try:
                self._saved_fd = signal.set_wakeup_fd(self._writer.fileno(),
                                                      warn_on_full_buffer=False)
            except ValueError:  # not the main thread of the main interpreter
                self._reader = self._writer = None
        _watching.append(self)
        self._thread = threading.Thread(target=self._watch, name="pallas-check-watchdog",
                                        daemon=True)
        self._thread.start()
        return self

    def _forget_in_child(self) -> None:
        """In a process forked during the run: its signals are its own, not this
        watchdog's (the parent's watchdog read a child's as a second Ctrl-C, exit 3)."""
        if self._writer is not None:
            signal.set_wakeup_fd(-1)
        for end in (self._reader, self._writer):
            if end is not None:
                end.close()
        self._reader = self._writer = None

    def __exit__(self, *exc: object) -> None:
        self._in_child.__exit__(None, None, None)
        with contextlib.suppress(ValueError):
            _watching.remove(self)
        self._stop.set()
        if self._writer is not None:  # wake the thread from its wait for a signal now,
            with contextlib.suppress(OSError):  # not at the end of its LISTEN_S: every
                self._writer.send(b"\0")  # run ended up to 0.25 s late (0: no signal)
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        if self._writer is not None:
            try:
                signal.set_wakeup_fd(self._saved_fd if self._saved_fd is not None else -1)
            except ValueError:
                pass
            self._writer.close()
        if self._reader is not None:
            self._reader.close()

    def _interrupts(self, timeout: float) -> int:
        """How many stop signals (SIGINT, SIGTERM) arrived within `timeout` seconds."""
        if self._reader is None:
            self._stop.wait(timeout)
            return 0
        ready, _, _ = select.select([self._reader], [], [], timeout)
        if not ready:
            return 0
        try:
            data = self._reader.recv(64)
        except OSError:
            return 0
        return sum(1 for b in data if interrupts.is_stop_signal(b))

    def _watch(self) -> None:
        # A stop recorded while the run was set up: the main thread stops before the
        # script, or this thread does after the grace period.
        interrupted_at: float | None = time.monotonic() if interrupts.requested() else None
        while not self._stop.is_set():
            count = self._interrupts(LISTEN_S)
            if self._stop.is_set():
                return
            now = time.monotonic()
            if count:
                if interrupted_at is not None or count > 1:
                    self._fire(interrupts.reason(" twice"))
                    return
                interrupted_at = now
            if interrupted_at is not None and now - interrupted_at >= self.grace_s:
                self._fire(f"{interrupts.reason()} while the script was blocked inside JAX")
                return
            if (self.stall_s > 0 and self._calls_in_flight() > 0
                    and progress.seconds_since_beat() >= self.stall_s):
                self._fire(f"stopped: a pallas_call made no progress for"
                           f" {self.stall_s:.0f} s (stuck)")
                return

    def _fire(self, reason: str) -> None:
        """emergency(reason) writes the partial report and says whether to end the process
        (not when the main thread is already reporting)."""
        end = True
        try:
            end = self._emergency(reason)
        finally:
            if end:
                children.end_children()  # none left running, holding the run's stdout
                flush_streams()
                _real_exit(int(ExitCode.USER_ERROR))


EXIT_GRACE_S = 10.0


def guard_exit(code: int, grace_s: float = EXIT_GRACE_S) -> None:
    """After the report: if the interpreter has not exited `grace_s` seconds from now
    (JAX's exit handler waits for computations that may never finish, e.g. a callback of
    the script's that blocks), end the process with `code`."""

    def end_later() -> None:
        time.sleep(grace_s)
        note("pallas-check: the script's JAX computations did not finish at exit; ending"
             " the process")
        children.end_children()
        flush_streams()
        _real_exit(int(code))

    threading.Thread(target=end_later, name="pallas-check-exit-guard", daemon=True).start()
