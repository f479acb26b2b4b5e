"""The compiled tier's builds under `--tier auto`: in the background, under a budget.

Why: a build's cost cannot be foreseen from the kernel (tiers.py's estimate is 0.3 s plus
2 ms an equation and 60 ms a DMA; paged attention with 16 pages a block traced to 24,000
operations that XLA compiled in 36 s and 1.4 GB, 32 pages a block in minutes and
gigabytes), so no compile may sit in a call's way: the structure's calls run on the engine
while its build runs, and switch to the tier when it is ready.

How, and why so: the trace is Python (a thread of this process; it shares the interpreter
with the engine, but stops at its budget's end as the compile does not need to), and the
XLA compile, which no thread can interrupt, runs in a worker process
(engine/runtime/bounded_compile.py) killed at its budget:

- time: as long as the engine has spent on the structure in this process (measured,
  growing while its calls go on; at least `MIN_SECONDS`): a compile that outlasts the
  engine's own work on the structure never pays;
- memory: the worker's resident memory at most this process's when the build began (at
  least `MIN_MEMORY`): the two together stay within twice the engine's.

A build that overruns is abandoned and recorded on disk for the structure
(`disk_cache.abandon`, keyed by the structure, the run's tier settings, the versions, the
CPU and the tier's own code, so a record is never read by a process it does not describe),
and no later process tries it: the engine carries on. `PALLAS_CHECK_CACHE_DIR=off` keeps
the record in this process only. `PALLAS_CHECK_COMPILE_BUDGET` (seconds) replaces the time
budget: 0 abandons every build (tests make a build overrun so).
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import tempfile
import threading
from pathlib import Path
from typing import Callable

import jax

import pallas_check
from pallas_check.compiled.program import Built, built, trace
from pallas_check.compiled.refs import Unsupported
from pallas_check.config import Config
from pallas_check.config.environment import COMPILE_BUDGET_VARIABLE
from pallas_check.engine.jaxpr.program import SEGMENT_COMPILER_OPTIONS
from pallas_check.engine.runtime import disk_cache
from pallas_check.engine.runtime.backend import engine_device
from pallas_check.engine.runtime.bounded_compile import Overrun, compile_bounded, resident_bytes
from pallas_check.jaxbridge.call import CallParams
from pallas_check.jaxbridge.export import exported
from pallas_check.process.host_memory import return_freed_memory

# The least time and memory a build's compile is given (a small structure's compile takes
# 0.3-2 s on the benchmark kernels; a worker holds about 150 MiB before it compiles).
MIN_SECONDS = 10.0
MIN_MEMORY = 512 * 2**20
ABANDONED = "its build was abandoned"


@functools.cache
def _tier_code() -> str:
    """A digest of the compiled tier's own code: a record made by other code (which may
    trace the structure to another program) is never trusted."""
    digest = hashlib.sha256(pallas_check.__version__.encode())
    for path in sorted(Path(__file__).parent.parent.joinpath("compiled").glob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def record_key(structure: str, config: Config) -> str:
    """The structure's abandonment record's key (object addresses in its text dropped:
    they differ between processes)."""
    text = re.sub(r" at 0x[0-9a-f]+", "", structure)
    settings = f"races={bool(config.races)} dma={config.dma_mode} uninit={config.uninit}"
    return disk_cache.key("\n".join((_tier_code(), settings, text)), SEGMENT_COMPILER_OPTIONS)


class Builds:
    """The run's builds in flight and done, per structure (safe across callback threads).
    `spent(structure)`: the engine's seconds on the structure so far (its time budget)."""

    def __init__(self, config: Config, spent: Callable[[str], float]) -> None:
        self.config = config
        self._spent = spent
        self._lock = threading.Lock()
        self._threads: dict[str, threading.Thread] = {}
        self._done: dict[str, Built | str] = {}
        self._abandoned: dict[str, str] = {}  # record key -> reason (this process's)

    def abandoned(self, structure: str) -> str | None:
        """Why the structure's build was abandoned, here or by an earlier process."""
        record = record_key(structure, self.config)
        reason = self._abandoned.get(record) or disk_cache.abandoned(record)
        return None if reason is None else f"{ABANDONED}: {reason}"

    def poll(self, structure: str, params: CallParams) -> Built | str | None:
        """The structure's build: done (its `Built`, or why it has none), or None while it
        runs (started here when it has not begun). Never waits."""
        with self._lock:
            found = self._done.get(structure)
            if found is not None or structure in self._threads:
                return found
            reason = self.abandoned(structure)
            if reason is not None:
                self._done[structure] = reason
                return reason
            thread = threading.Thread(target=self._build, args=(structure, params),
                                      name="pallas-check build", daemon=True)
            self._threads[structure] = thread
        thread.start()
        return None

    def settle(self) -> None:
        """Wait for every build in flight (tests; a build still takes its budget)."""
        for thread in list(self._threads.values()):
            thread.join()

    def _budget(self, structure: str) -> float:
        fixed = os.environ.get(COMPILE_BUDGET_VARIABLE)
        if fixed is not None and fixed.strip():
            return float(fixed)
        return max(MIN_SECONDS, self._spent(structure))

    def _build(self, structure: str, params: CallParams) -> None:
        memory = max(MIN_MEMORY, resident_bytes(os.getpid()) or 0)
        try:
            result: Built | str = self._built(structure, params, memory)
        except Overrun as exc:
            reason = str(exc)
            record = record_key(structure, self.config)
            with self._lock:
                self._abandoned[record] = reason
            disk_cache.abandon(record, reason)
            result = f"{ABANDONED}: {reason}"
        except Unsupported as exc:
            result = str(exc)
        except Exception as exc:  # noqa: BLE001 - any failure: the engine runs the calls
            result = f"its build failed ({type(exc).__name__}: {exc})"
        # What the trace freed back to the OS (left in the heap, it sat under the calls'
        # buffers: benchmarks/README.md, "Latest results").
        return_freed_memory(at_once=True)
        with self._lock:
            self._done[structure] = result

    def _built(self, structure: str, params: CallParams, memory: int) -> Built:
        """Traced here, compiled by the worker (read back from the disk cache when a
        process compiled it before), or `Overrun`."""
        with jax.default_device(engine_device()):
            found = trace(params, self.config)
            blob, text = exported(found.jitted, found.avals)
        options = SEGMENT_COMPILER_OPTIONS
        path = disk_cache.entry_path(text, options)
        if path is not None:
            executable = disk_cache.read_entry(path, engine_device())
            if executable is not None:
                return built(found, executable)
        with tempfile.TemporaryDirectory(prefix="pallas-check-build-") as scratch:
            target = path or Path(scratch) / "entry.xla"
            try:
                compile_bounded(blob, options, target, lambda: self._budget(structure),
                                memory)
            except RuntimeError as exc:  # XLA's refusal, or the worker died
                raise Unsupported(str(exc)) from exc
            executable = disk_cache.read_entry(target, engine_device())
        if executable is None:
            raise Unsupported("its executable could not be read back from its worker")
        return built(found, executable)
