"""A transient progress line on a terminal while a call is simulated: grid steps done out
of the total, steps per second, the schedule and the pass.

A 10^6-step grid is half a minute of simulation with nothing else to show for it. The
engine only counts (engine/runtime/progress.py: one int increment per grid step); this module
reads the counters from a thread of its own a few times a second and draws one line on
stderr with rich, erased when the call ends. Shown only where stderr is a terminal and the
caller asked for it (`pallas-check run` when no machine-readable report goes to stdout;
the Python API with `progress=True`); never in pipes, so logs stay byte for byte as they
were.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Callable, Protocol, TextIO

from pallas_check.engine.runtime import progress
from pallas_check.config.formats import Format

if TYPE_CHECKING:  # annotations only (rich is imported when a line is drawn)
    from rich.live import Live

    from pallas_check.config import Config
    from pallas_check.engine.runtime.progress import GridSteps

# A call shows its line once it has run this long (short calls never flicker one), and the
# line is redrawn this often.
SHOW_AFTER_S = 0.5
REFRESH_S = 0.25


class ShowsProgress(Protocol):
    """What the line reads of a session (intercept/session.py's Session): its configuration, and the
    callback it calls as each schedule of a call ends (call index, kernel, done, total)."""

    config: Config
    progress: Callable[[int, str, int, int], None] | None


def wanted(fmt: str, output: Path | str | None, stream: TextIO | None = None) -> bool:
    """Whether `pallas-check run` shows progress: stderr is a terminal, and no JSON or
    SARIF report is being written to stdout (those are for machines, even on a terminal:
    `Format.progress_beside`)."""
    to_stdout = output is None or str(output) == "-"
    if to_stdout and not Format(fmt).progress_beside:
        return False
    return is_terminal(stream if stream is not None else sys.stderr)


def describe(steps: GridSteps, schedule: tuple[int, int] | None, now: float) -> str:
    """The line of one call, e.g. `call 3 flash_kernel: 41,000/1,000,000 grid steps (4%),
    39,800 steps/s` (ASCII only: any terminal encoding can show it)."""
    total = max(steps.total, 1)
    elapsed = now - steps.started
    rate = steps.done / elapsed if elapsed > 0 else 0.0
    text = (f"pallas-check: call {steps.call_index} {steps.kernel}: {steps.done:,}/"
            f"{steps.total:,} grid steps ({100 * steps.done // total}%),"
            f" {rate:,.0f} steps/s")
    if schedule is not None and schedule[1] > 1:
        text += f", schedule {min(schedule[0] + 1, schedule[1])}/{schedule[1]}"
    if steps.passes > 1:  # the call simulated again: a schedule, a second fill, a re-run
        text += f", pass {steps.passes}"
    return text


def is_terminal(stream: TextIO) -> bool:
    """Whether `stream` is a terminal (a closed or replaced stream is not)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


class ProgressLine:
    """While entered: the line of the calls in flight on `stream` (stderr), from a thread
    that polls the engine's counters; the session's schedule callback is also taken."""

    def __init__(self, session: ShowsProgress, stream: TextIO | None = None) -> None:
        self.session = session
        self.stream = stream if stream is not None else sys.stderr
        self.schedules: dict[int, tuple[int, int]] = {}  # call index -> (done, total)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._live: Live | None = None
        self._lock = threading.Lock()  # the poll thread and `stop` both draw

    def __enter__(self) -> "ProgressLine":
        _active.add(self)
        self.session.progress = self._schedule_done
        self._thread = threading.Thread(target=self._poll, name="pallas-check-progress",
                                        daemon=True)
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.session.progress = None
        self.stop()

    def stop(self) -> None:
        """No more line: the thread ends and the line is erased (the cursor shown)."""
        _active.discard(self)
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        with self._lock:
            self._hide()

    def _schedule_done(self, call_index: int, kernel: str, done: int, total: int) -> None:
        self.schedules[call_index] = (done, total)

    def _poll(self) -> None:
        try:
            self._polling()
        except Exception:  # noqa: BLE001 - a progress line never fails a run: gone
            self._stop.set()
            with contextlib.suppress(Exception), self._lock:
                self._hide()

    def _polling(self) -> None:
        while not self._stop.wait(REFRESH_S):
            now = time.monotonic()
            calls = [s for s in progress.live_calls()
                     if s.total and (now - s.started >= SHOW_AFTER_S or s.passes > 1)]
            if not calls:
                with self._lock:
                    self._hide()
                continue
            first = (0, self.session.config.schedules)  # before a call's first schedule ends
            lines = [describe(s, self.schedules.get(s.call_index, first), now) for s in calls]
            with self._lock:
                if not self._stop.is_set():
                    self._show("\n".join(lines))

    def _show(self, text: str) -> None:
        from rich.console import Console
        from rich.live import Live
        from rich.text import Text

        if self._live is None:
            console = Console(file=self.stream, highlight=False)
            if not console.is_terminal or console.is_dumb_terminal:
                return
            # What the script prints while the line is up (a kernel's debug print) goes
            # above it, when stdout is the same terminal; a redirected stdout stays so.
            self._live = Live(console=console, transient=True, auto_refresh=False,
                              redirect_stdout=is_terminal(sys.stdout),
                              redirect_stderr=False)
            self._live.start()
        self._live.update(Text(text, no_wrap=True, overflow="ellipsis"), refresh=True)

    def _hide(self) -> None:
        live, self._live = self._live, None
        if live is not None:
            live.stop()


_active: set[ProgressLine] = set()


def clear() -> None:
    """Erase every progress line now: a report is about to be written to the terminal
    (also from the watchdog's thread, while a call is still in flight)."""
    for line in list(_active):
        line.stop()
