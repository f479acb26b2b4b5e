"""Which way a checked call runs: the compiled tier or the engine, per call structure.

`--tier auto` (the default) runs a call compiled (`pallas_check/compiled/`) when it is
eligible and its kernel traces; the verdict decides whether that run stands: clear, its
outputs are the call's; any bit set, the engine runs the call again and reports it. The
engine stays the only writer of findings. `--tier engine` always runs the engine;
`--tier compiled` makes an ineligible call a one-line error.

A structure is built once (eligibility, two tracing passes, an XLA compile) and kept,
its executable or the reason it has none: a jitted loop's calls share it.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Collection, Sequence

import numpy as np

import jax

from pallas_check.compiled.eligibility import ineligible
from pallas_check.compiled.machine import Unsupported
from pallas_check.compiled.program import Compiled, build
from pallas_check.compiled.verdict import describe as describe_verdict
from pallas_check.config import Config
from pallas_check.engine.runtime.backend import engine_device
from pallas_check.intercept.call_filter import StructureKeys
from pallas_check.jaxbridge.call import CallParams

ENGINE, COMPILED = "engine", "compiled"


@dataclasses.dataclass(frozen=True)
class TierRun:
    """What the compiled tier made of one call: its outputs when its run stands (None:
    the engine runs the call), and why not."""

    outputs: list[np.ndarray] | None
    reason: str


class Tiers:
    """The run's choice of tier per call structure (safe across callback threads)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        import os
        self.mode = os.environ.get("PCT_TIER") or str(getattr(getattr(config, "tier", "auto"), "value",
                                getattr(config, "tier", "auto")))
        self._structures = StructureKeys()
        self._built: dict[str, Compiled | str] = {}
        self._lock = threading.Lock()

    def refusal(self, params: CallParams, devices: int,
                never_written: Collection[int]) -> str | None:
        """Why the compiled tier will not run this call (None: it will try)."""
        if self.mode == ENGINE:
            return "--tier engine"
        found = ineligible(params, self.config, devices, never_written)
        if found is not None:
            return found
        built = self._executable(params)
        return built if isinstance(built, str) else None

    def run(self, params: CallParams, operands: Sequence[np.ndarray],
            results: Sequence[np.ndarray] | None) -> TierRun:
        """The call run compiled (after `refusal` said it may be): its outputs (in
        `results` where given) when the verdict is clear."""
        executable = self._executable(params)
        assert not isinstance(executable, str)
        with jax.default_device(engine_device()):
            outputs, verdict = executable(*operands)
            bits = int(verdict)
        if bits:
            return TierRun(None, f"the compiled run saw {describe_verdict(bits)}")
        arrays = [np.asarray(o) for o in outputs]
        if results is not None:
            for k, (target, value) in enumerate(zip(results, arrays)):
                if target.shape == value.shape and target.dtype == value.dtype:
                    target[...] = value
                    arrays[k] = target
        return TierRun(arrays, "")

    def _executable(self, params: CallParams) -> Compiled | str:
        key = self._structures.of(params)
        found = self._built.get(key)
        if found is None:
            try:
                with jax.default_device(engine_device()):
                    found = build(params, self.config)
            except Unsupported as exc:
                found = str(exc)
            with self._lock:
                self._built[key] = found
        return found
