"""The process's own memory around a checked call: freed memory handed back to the OS, and
Python's cyclic collector paused while a call is simulated (intercept/session.py uses both)."""

from __future__ import annotations

import contextlib
import functools
import gc
import threading
import time
from typing import Callable, Iterator


# At most one trim per this many seconds: a trim walks the whole heap (about 0.7 ms on a
# JAX process), as much as a quarter of a small call's simulation; a call that ran longer
# than this is always followed by one.
TRIM_INTERVAL_S = 0.25
_last_trim = [float("-inf")]


def return_freed_memory(at_once: bool = False) -> None:
    """Hand the memory calls freed back to the OS (glibc keeps freed blocks of up to its
    adaptive mmap threshold, which a call's large arrays raise, in the heap: without this
    a long script's resident memory grows by the size of its largest calls). `at_once`:
    whatever the interval, after work that freed much and is rare (an XLA compile of the
    compiled tier frees tens of MiB that would otherwise stay resident under the call
    that follows it, raising the process's peak); such a trim does not count toward the
    interval, so the trim after that call, which frees the call's own buffers, still runs."""
    if at_once:
        _trim()
        return
    if time.monotonic() - _last_trim[0] < TRIM_INTERVAL_S:
        return
    _trim()
    _last_trim[0] = time.monotonic()


def _trim() -> None:
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to do
        return None


_gc_lock = threading.Lock()
_gc_holders = [0, False]  # calls in flight that paused the collector; whether we paused it


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic collector off while a call is simulated (never turned on if the
    script had it off). A call allocates short-lived objects by the hundred thousand, and
    each full collection it set off walked the whole process heap: JAX's included, 15-120
    ms a time in a benchmark process, a third of a slow call's time. Refcounting still frees
    what a call drops; cyclic garbage waits for the next collection after the call."""
    with _gc_lock:
        if _gc_holders[0] == 0:
            _gc_holders[1] = gc.isenabled()
            gc.disable()
        _gc_holders[0] += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_holders[0] -= 1
            if _gc_holders[0] == 0 and _gc_holders[1]:
                gc.enable()
