"""The chip's own verdict on each call, as the call is made: every distinct call compiled
for the first `--tpu` generation with libtpu's compile-only devices while the user's
program lowers it (intercept/patched_lowering.py's `ChipHook`).

Why at the call: on a TPU a kernel Mosaic or the Pallas TPU lowering refuses never runs;
the jitted call (or the eager `pallas_call`) raises, at that line, before anything of the
program runs. A program, or a test asserting that refusal (`pytest.raises`), sees the
same here: the exception of the class and message the chip's toolchain raised, from the
lowering of the call. The refusal is also a `compile-error` (or `vmem-exceeded`) finding
at the user's line, and the call is listed, not run.

A compile runs once per call structure in a process (tpu_compile/compiler.py's cache)
and a success is kept on disk across runs (tpu_compile/outcome_cache.py). Without libtpu
nothing is compiled and the report says once that the compile was not checked.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Sequence

import numpy as np

from pallas_check.config import Config, TpuGeneration, parse_generations
from pallas_check.engine.call import describe
from pallas_check.engine.jaxpr import ahead
from pallas_check.jaxbridge.call import kernel_of
from pallas_check.engine.call.capacity import CapacityCheck
from pallas_check.findings.finding import Finding, KernelInfo, SourceFrame
from pallas_check.intercept.patched_lowering import MeshAxes, real_lowering
from pallas_check.tpu_compile import outcome_cache, remote, toolchain
from pallas_check.tpu_compile.compiler import (CompileOutcome, OperandAvals, cached_outcome,
                                               compile_call)
from pallas_check.tpu_compile.stage import RecordedCall, finding_for

# The report's note when the compile was asked for and libtpu is not there.
NOT_CHECKED = toolchain.NOT_CHECKED

# refused(params, kernel, call_site, mesh_axes, finding-maker) -> the call's index: the
# session lists the call as not run and keeps the finding the maker builds for that index.
Refused = Callable[[dict, KernelInfo, SourceFrame | None, MeshAxes,
                    Callable[[int], Finding]], int]


class ChipCheck:
    """The compile at the call, for one session."""

    def __init__(self, config: Config, refused: Refused) -> None:
        self.generation: TpuGeneration = parse_generations(config.tpu)[0]
        self.on = config.chip_compile and toolchain.libtpu_missing() is None
        # Asked for and not done: the report says so once (runner.finished_report).
        self.not_checked = config.chip_compile and not self.on
        self._refused = refused
        # The exceptions given to the program, by identity: a script that ends in one
        # ended on a finding, not on a bug of its own (run/runner.py).
        self.raised: list[BaseException] = []
        self.compiles = 0  # compiles this session started (not found in the cache)
        self.seconds = 0.0  # and their time
        self.prepared = 0  # engine segments compiled while the worker compiled
        self._skip_floats = bool(config.skip_floats)
        if self.on and remote.enabled and outcome_cache.empty():
            # A first run: its first call will need the worker, which starts meanwhile.
            remote.prestart(toolchain.topology_name(self.generation))

    def check(self, params: dict, avals: OperandAvals, mesh_axes: MeshAxes,
              call_site: SourceFrame | None) -> None:
        """As the call is lowered: nothing when the chip builds it; else the finding, and
        the chip's exception raised into the program's lowering."""
        outcome = self._outcome(params, avals, mesh_axes)
        if outcome is None or outcome.ok or outcome.raised is None:
            return
        try:
            kernel = describe.kernel_info(params)
        except Exception:  # noqa: BLE001 - an unnamed call is still refused
            kernel = KernelInfo("pallas_call")
        raised = outcome.raised
        exc = raised.exception()

        def finding(index: int) -> Finding:
            found = finding_for(RecordedCall(index, params, avals, mesh_axes, kernel,
                                             call_site), outcome)
            found.message += (f"; the call raises {raised.name} in the program"
                              + (", where a TPU host's process ends" if outcome.crashed
                                 else ", as on a TPU"))
            found.details["raised"] = raised.name
            return found

        self._refused(params, kernel, call_site, mesh_axes, finding)
        self.raised.append(exc)
        raise exc

    def compiled(self, params: dict, avals: OperandAvals, mesh_axes: MeshAxes
                 ) -> CompileOutcome | None:
        """The outcome of this call's compile at its lowering, if it was compiled."""
        if not self.on:
            return None
        return cached_outcome(params, avals, mesh_axes, self.generation)

    def fits(self, found: CapacityCheck, params: dict, operands: Sequence[np.ndarray],
             mesh_axes: MeshAxes) -> CapacityCheck:
        """The capacity check of a call about to run, with the compiler's word for the
        first generation where the call was compiled: it built, so pallas-check's own
        reckoning of its VMEM (engine/call/capacity.py, an estimate) is withdrawn for that
        generation (a call it refuses never gets here: it raised)."""
        avals = tuple((tuple(int(d) for d in np.shape(x)), str(np.result_type(x)))
                      for x in operands)
        outcome = self.compiled(params, avals, mesh_axes)
        if outcome is None or not outcome.ok:
            return found
        kept = [f for f in found.findings
                if not (f.reckoned and f.generation == self.generation.value)]
        return CapacityCheck(kept, found.simulated or len(kept) < len(found.findings))

    def ended_program(self, exc: BaseException | None) -> bool:
        """Whether `exc` (what the script ended with) is, or was raised from, a refusal
        this session raised."""
        seen = 0
        while exc is not None and seen < 16:
            if any(exc is raised for raised in self.raised):
                return True
            exc = exc.__cause__ or exc.__context__
            seen += 1
        return False

    def _prepare(self, params: dict) -> None:
        """While the worker compiles the call for the chip (on another core), the engine's
        segments of its kernel are compiled here, as its first call would (a first run:
        the two compiles overlap instead of following each other)."""
        try:
            self.prepared += ahead.prepare(kernel_of(params), self._skip_floats)
        except Exception:  # noqa: BLE001 - the call's own evaluation meets it
            pass

    def _outcome(self, params: dict, avals: OperandAvals, mesh_axes: MeshAxes
                 ) -> CompileOutcome | None:
        if not self.on or math.prod(size for _, size in mesh_axes) > 1:
            # A call inside a shard_map over several devices is compiled at its lowering
            # against the run's CPU devices, which no TPU topology matches: left to
            # `--compile`, which compiles it over that many chips after the script.
            return None
        known = cached_outcome(params, avals, mesh_axes, self.generation)
        if known is not None:
            return known
        started = time.perf_counter()
        try:
            with real_lowering():
                outcome = compile_call(params, avals, mesh_axes, self.generation,
                                       meanwhile=lambda: self._prepare(params))
        except Exception:  # noqa: BLE001 - ours (placing the call): the simulation goes on
            return None
        self.compiles += 1
        self.seconds += time.perf_counter() - started
        return outcome
