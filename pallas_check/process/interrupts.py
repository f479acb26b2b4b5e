"""Ctrl-C and SIGTERM stop a run the same way: a partial report, exit 3, nothing left behind.

SIGTERM is what CI runners, `timeout` and process managers send; by default it kills the
process where it stands (no report, exit 143, a report's temporary file left behind when
it lands mid-write). Here both signals are the user's request to stop, kept in one place:

- while a run is being set up (JAX starting, the interception installed) a stop is only
  recorded, and the run stops before the script starts. A `KeyboardInterrupt` raised
  there lands wherever the interpreter is -- often in one of JAX's garbage-collector
  callbacks, whose exceptions Python prints and ignores ("Exception ignored in:
  _xla_gc_callback"), and the run went on to a full report;
- while the script runs, a stop raises `KeyboardInterrupt` in the main thread, as Ctrl-C
  does; since the script (or a callback that swallows exceptions) may not let it
  through, the runner also asks `requested()` when the script ends, and the watchdog
  ends a run that goes on regardless;
- while the report is written, a stop is recorded and the report finished: it is
  complete, and an interrupted write would lose it;
- a second stop while stops are held raises at once (the user insists);
- a process the script forks gets the handlers it had before ours (`forget_in_child`):
  only the process that started the run handles stops (process/children.py).

The first stop's signal is remembered for the report (`reason()`).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from types import FrameType
from typing import Callable, Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_NAMES: dict[int, str] = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}

_received: list[int] = []  # the stop signals of this run, in order
_holding = [False]  # a stop is recorded, not raised (set-up and reporting)
# each signal's handler before we first took it (as signal.getsignal answers)
_originals: dict[int, Callable[[int, FrameType | None], object] | int | None] = {}


def _on_signal(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)
    if _holding[0] and len(_received) < 2:
        return
    raise KeyboardInterrupt


def latest() -> int | None:
    """The stop signal this run received last (None: none)."""
    return _received[-1] if _received else None


def requested() -> bool:
    """Whether a stop signal arrived during this run."""
    return bool(_received)


def reason(detail: str = "") -> str:
    """How the run was stopped, as the report says it: `interrupted (Ctrl-C)`."""
    first = _received[0] if _received else signal.SIGINT
    return f"interrupted ({_NAMES.get(first, signal.Signals(first).name)}{detail})"


def is_stop_signal(signum: int) -> bool:
    return signum in SIGNALS


class _QuietInterrupts(logging.Filter):
    """JAX logs the exception of a `jax.debug.callback` with its traceback before raising
    it again: for the user's own interrupt that is a raw KeyboardInterrupt on stderr, on
    top of the report that already says the run was interrupted."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[0] if record.exc_info else None
        return not (exc is not None and issubclass(exc, KeyboardInterrupt))


_DEBUG_CALLBACK_LOGGER = "jax._src.debugging"  # jax.debug.callback's failures


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """Ctrl-C and SIGTERM handled as above while active (only where signals can be: the
    main thread; elsewhere nothing changes). Stops are held until `delivering()`. An
    outer `handled()` (the command line's, from its start) keeps what it recorded."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in SIGNALS}
    outermost = not any(handler is _on_signal for handler in previous.values())
    if outermost:
        _received.clear()
    held = _holding[0]
    _holding[0] = True
    quiet = _QuietInterrupts()
    logger = logging.getLogger(_DEBUG_CALLBACK_LOGGER)
    logger.addFilter(quiet)
    try:
        _take(SIGNALS)
        yield
    finally:
        logger.removeFilter(quiet)
        _holding[0] = held
        if outermost:
            for s, handler in previous.items():
                signal.signal(s, handler if handler is not None else signal.SIG_DFL)


def install() -> None:
    """The command line's: stops handled for the whole process, raised (not held) until a
    run holds them; what they record carries into the run."""
    if threading.current_thread() is threading.main_thread():
        _received.clear()
        _take(SIGNALS)


def _take(signals: tuple[int, ...]) -> None:
    """Our handler for `signals`, but not for one the parent process told us to ignore
    (a shell starting a job in the background ignores Ctrl-C for it: so do we)."""
    for s in signals:
        current = signal.getsignal(s)
        if current is signal.SIG_IGN:
            continue
        if current is not _on_signal:
            _originals[s] = current
        signal.signal(s, _on_signal)


def forget_in_child() -> None:
    """In a process the script forked during the run (process/children.py): the handlers the
    process had before ours (Python's KeyboardInterrupt for Ctrl-C, SIGTERM's default:
    a pool worker `Pool.terminate` stops ends quietly), and no stop recorded. Only the
    process that started the run handles stops."""
    for s in SIGNALS:
        if signal.getsignal(s) is _on_signal:
            original = _originals.get(s)
            signal.signal(s, original if original is not None else signal.SIG_DFL)
    _received.clear()
    _holding[0] = False


@contextlib.contextmanager
def delivering() -> Iterator[None]:
    """While the script runs: a stop raises KeyboardInterrupt in the main thread."""
    held = _holding[0]
    _holding[0] = False
    try:
        yield
    finally:
        _holding[0] = held
