"""A checking session: the handler behind the interception, and what it collected.

One session per run of a user script (or per test under the pytest plugin). Engine state
belongs to one call; the session only keeps findings, per-call summaries and the first
error the engine raised (so the runner can tell our failure from the user's).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import threading
import time
from typing import Iterator, Sequence

import numpy as np

from pallas_check.config import Config
from pallas_check.findings import Finding, FindingStore


@dataclasses.dataclass
class CallSummary:
    """What the report says about one pallas_call: which kernel, its grid, its cost."""

    index: int
    kernel: str
    file: str
    line: int
    grid: tuple[int, ...]
    seconds: float
    findings: int


class EngineFailure(Exception):
    """Raised inside the host callback when the engine cannot go on (reported, exit 4)."""


class Session:
    """Collects findings from every intercepted pallas_call of a run."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.store = FindingStore()
        self.calls: list[CallSummary] = []
        self.engine_error: str | None = None
        self._counter = itertools.count()
        self._lock = threading.Lock()

    # The interception handler.
    def handle_call(self, params: dict, operands: Sequence[np.ndarray]) -> list[np.ndarray]:
        from pallas_check.engine.evaluate import KernelError
        from pallas_check.engine.kernel import kernel_info, run_call

        with self._lock:
            index = next(self._counter)
        started = time.perf_counter()
        kernel = kernel_info(params)
        try:
            result = run_call(params, operands, self.config, index)
        except KernelError as exc:
            self._fail(f"{kernel.name}: {exc.located()}")
            raise EngineFailure(self.engine_error) from exc
        except Exception as exc:  # our bug: keep the message, the runner exits 4
            self._fail(f"internal error while simulating {kernel.name}:"
                       f" {type(exc).__name__}: {exc}")
            raise EngineFailure(self.engine_error) from exc
        self.store.extend(result.findings)
        grid = tuple(int(g) for g in params["grid_mapping"].grid)
        with self._lock:
            self.calls.append(CallSummary(index, kernel.name, kernel.file, kernel.line, grid,
                                          time.perf_counter() - started, len(result.findings)))
        return result.outputs

    def _fail(self, message: str) -> None:
        with self._lock:
            if self.engine_error is None:
                self.engine_error = message

    @property
    def findings(self) -> list[Finding]:
        return self.store.all()

    @contextlib.contextmanager
    def install(self) -> Iterator[None]:
        """Intercept pallas_calls into this session, with the simulated TPU answering
        kernels that ask which chip they run on."""
        from pallas_check.intercept import intercepted
        from pallas_check.tpu_info import simulated_tpu

        with intercepted(self.handle_call), simulated_tpu(self.config.tpu, self.config.cores):
            yield
