"""XLA compiles under a time and memory budget, in a worker process that is killed at it.

Why a process: `Lowered.compile` is one call into XLA that no thread can interrupt, and
the compiled tier met programs whose compile ran for minutes and took gigabytes (paged
attention with many pages per block: docs/speed.md). A thread would leave that compile
running, holding its memory, however long the budget said; a child process is killed at
the budget and its memory is the OS's again. The parent never waits on it: the engine
serves the structure's calls meanwhile (intercept/builds.py), and a compile that overruns
is abandoned.

One worker serves the process's compiles one at a time (importing JAX costs it about a
second and 150 MiB, paid once, not per compile); a worker killed at a budget is replaced
at the next compile. A compile's result is written where the disk cache keeps it
(`disk_cache.write_entry`), and the parent reads it back from there. `JAX_PLATFORMS=cpu`:
the worker compiles for this CPU, never starts libtpu.

Run as `python -m pallas_check.engine.runtime.bounded_compile` (the worker's side: jobs
on stdin, one answer each on stdout, length-prefixed pickles).
"""

from __future__ import annotations

import atexit
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Callable, Mapping

from pallas_check.engine.runtime.disk_cache import write_entry
from pallas_check.jaxbridge.export import compile_exported

# How often the parent looks at the worker's time and resident memory while it compiles.
_POLL_S = 0.05
_HEADER = struct.Struct("<Q")


def send_frame(stream: IO[bytes], value: object) -> None:
    """One length-prefixed pickle (this worker's and the TPU compile worker's frames)."""
    data = pickle.dumps(value)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def receive_frame(stream: IO[bytes]) -> object:
    """The next frame `send_frame` wrote; EOFError where the stream ended first."""
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError("the compile worker's stream ended")
    (size,) = _HEADER.unpack(header)
    return pickle.loads(stream.read(size))


def resident_bytes(pid: int) -> int | None:
    """A process's resident memory (None where /proc does not say)."""
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class Overrun(Exception):
    """The compile passed its budget: its worker was killed (the message says which)."""


class _Worker:
    """The compile worker process, started when first needed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None

    def _started(self) -> subprocess.Popen[bytes]:
        if self._process is None or self._process.poll() is not None:
            env = dict(os.environ, JAX_PLATFORMS="cpu")
            self._process = subprocess.Popen(
                [sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        return self._process

    def stop(self) -> None:
        """The worker killed (a compile past its budget, or the process ending)."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    def compile(self, blob: bytes, options: Mapping[str, str | bool] | None, path: Path,
                seconds: Callable[[], float], memory: int) -> None:
        """The exported program `blob` compiled by the worker and written at `path`.
        `seconds()`: the time budget, asked as the compile goes (it may grow: the engine
        keeps serving the structure); `memory`: the most resident bytes the worker may
        hold. Raises `Overrun` past either (the worker killed) and `RuntimeError` with
        XLA's refusal."""
        with self._lock:
            process = self._started()
            assert process.stdin is not None and process.stdout is not None
            started = time.monotonic()
            send_frame(process.stdin, (blob, dict(options or {}), str(path)))
            while True:  # (the budget first: one of 0 overruns before any answer)
                elapsed = time.monotonic() - started
                budget = seconds()
                if elapsed >= budget:
                    self.stop()
                    raise Overrun(f"its XLA compile passed its time budget ({budget:.1f} s)")
                held = resident_bytes(process.pid)
                if held is not None and held > memory:
                    self.stop()
                    raise Overrun(f"its XLA compile passed its memory budget "
                                  f"({memory / 2**20:.0f} MiB)")
                if select.select([process.stdout], [], [], _POLL_S)[0]:
                    break
            try:
                answer = receive_frame(process.stdout)
            except EOFError as exc:  # (it died: killed from outside, or out of memory)
                self.stop()
                raise RuntimeError("the compile worker ended") from exc
        if answer is not None:
            raise RuntimeError(str(answer))


_worker = _Worker()
atexit.register(_worker.stop)


def compile_bounded(blob: bytes, options: Mapping[str, str | bool] | None, path: Path,
                    seconds: Callable[[], float], memory: int) -> None:
    """`_Worker.compile` on the process's one worker."""
    _worker.compile(blob, options, path, seconds, memory)


def _serve() -> None:
    """The worker: each job compiled and written where the parent said; the answer is
    None, or XLA's refusal as text."""
    jobs, answers = sys.stdin.buffer, sys.stdout.buffer
    while True:
        try:
            job = receive_frame(jobs)
        except EOFError:
            return
        assert isinstance(job, tuple) and len(job) == 3
        blob, options, path = job
        try:
            write_entry(Path(str(path)), compile_exported(bytes(blob), dict(options)))
            answer: str | None = None
        except Exception as exc:  # noqa: BLE001 - XLA's refusal goes back as text
            answer = f"XLA cannot compile it ({type(exc).__name__})"
        send_frame(answers, answer)


if __name__ == "__main__":
    _serve()
