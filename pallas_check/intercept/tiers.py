"""Which way a checked call runs: the compiled tier or the engine, per call structure.

`--tier auto` (the default) runs a call compiled (`pallas_check/compiled/`) when it is
eligible and its kernel traces; the verdict decides whether that run stands: clear, its
outputs are the call's; any bit set, the engine runs the call again and reports it. The
engine stays the only writer of findings. `--tier engine` always runs the engine;
`--tier compiled` makes an ineligible call a one-line error.

A structure is built once (eligibility, two tracing passes, an XLA compile) and kept,
its executable or the reason it has none: a jitted loop's calls share it. Under `auto`
the build runs in the background under a budget (intercept/builds.py) while the engine
serves the structure's calls, which switch to the tier when it is ready; a build that
overran is remembered on disk, and `--tier compiled` (which waits for its own builds)
refuses such a structure with that reason.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from typing import Collection, Sequence

import numpy as np

import jax

from pallas_check.compiled.eligibility import ineligible
from pallas_check.compiled.refs import Unsupported
from pallas_check.compiled.program import Built, Compiled, build
from pallas_check.intercept.builds import Builds
from pallas_check.compiled.verdict import describe as describe_verdict
from pallas_check.config import Config, Tier
from pallas_check.config.errors import TierRefused
from pallas_check.engine.runtime.backend import engine_device, lend_to_engine
from pallas_check.intercept.call_filter import StructureKeys
from pallas_check.jaxbridge.call import CallDescription, CallParams, describe
from pallas_check.jaxbridge.jaxprs import sub_jaxprs
from pallas_check.jaxbridge.params import scan_loop
from pallas_check.jaxbridge.primitives import dma_start_p, dma_wait_p, scan_p, while_p
from pallas_check.jaxbridge.types import Jaxpr
from pallas_check.process.host_memory import return_freed_memory

ENGINE, COMPILED = Tier.ENGINE.value, Tier.COMPILED.value
# Why a small structure's call ran on the engine (it is compiled once it has cost enough).
_NOT_YET = "not compiled yet: the engine's time on it is below a compile's"
# Why a call ran on the engine while its structure's build runs (intercept/builds.py).
_BUILDING = "not compiled yet: its build is running in the background"

# Compiling a structure costs 0.35-5.6 s of tracing and XLA more than the engine's first
# call (benchmarks/README.md, "Compiled tier"): about this much, plus per equation of the
# kernel and more per DMA start or wait (each is a table row, a landing, a retirement).
# Under `auto` a structure is compiled once the engine has spent about what its compile
# would cost (a ski rental: never much more than twice the better choice's cost): at its
# first call when the engine's estimate for one call (`engine_seconds`) reaches it, else
# when the engine's measured time on its calls so far does.
COMPILE_SECONDS = 0.3
_COMPILE_EQUATION_SECONDS, _COMPILE_DMA_SECONDS = 2e-3, 60e-3
# The engine's cost per grid step and per equation evaluated (measured: about 145 us a
# step of a small kernel, 140 us a DMA start and wait, benchmarks/README.md).
_ENGINE_STEP_SECONDS, _ENGINE_EQUATION_SECONDS = 145e-6, 15e-6
# A while loop's trips when they are not known before it runs.
_WHILE_TRIPS_GUESS = 8
# What a compiled call's host callback costs beside its computation (a Python callback,
# its operands handed to the engine's client, its outputs copied back: 0.3-0.8 ms measured
# on paged attention), which a call lowered inline does not pay. Inlining costs the
# structure's computation compiled again inside each program that holds it, so a
# structure is inlined once its calls have paid about a compile in callbacks.
_HOST_CALL_SECONDS = 0.4e-3


def compile_seconds(call: CallDescription) -> float:
    """About what compiling the structure costs beyond the engine's first call."""
    equations, dmas = _size(call.kernel)
    return (COMPILE_SECONDS + _COMPILE_EQUATION_SECONDS * equations
            + _COMPILE_DMA_SECONDS * dmas)


def inline_seconds(call: CallDescription) -> float:
    """About what inlining the structure costs: its computation compiled again, inside the
    program that holds it (as much as the tier's own compile of it)."""
    return compile_seconds(call)


def _size(jaxpr: Jaxpr) -> tuple[int, int]:
    """The kernel's equations and its DMA starts and waits, nested ones included."""
    equations = dmas = 0
    for eqn in jaxpr.eqns:
        equations += 1
        dmas += eqn.primitive in (dma_start_p, dma_wait_p)
        for sub in sub_jaxprs(eqn):
            inner = _size(sub)
            equations, dmas = equations + inner[0], dmas + inner[1]
    return equations, dmas


def engine_seconds(call: CallDescription) -> float:
    """About how long the engine takes on one call of this structure."""
    steps = math.prod(int(n) for n in call.grid) if all(
        isinstance(n, int) for n in call.grid) else 1
    return steps * (_ENGINE_STEP_SECONDS + _ENGINE_EQUATION_SECONDS * _evaluated(call.kernel))


def _evaluated(jaxpr: Jaxpr) -> int:
    """Equations one run of `jaxpr` evaluates, loops counted by their trips."""
    total = 0
    for eqn in jaxpr.eqns:
        inner = [_evaluated(sub) for sub in sub_jaxprs(eqn)]
        if eqn.primitive is scan_p:
            total += scan_loop(eqn).length * sum(inner)
        elif eqn.primitive is while_p:
            total += _WHILE_TRIPS_GUESS * sum(inner)
        else:
            total += 1 + max(inner, default=0)
    return total


@dataclasses.dataclass(frozen=True)
class TierRun:
    """What the compiled tier made of one call: its outputs when its run stands (None:
    the engine runs the call), and why not."""

    outputs: list[np.ndarray] | None
    reason: str
    # Races on: what the race check covered (the JSON report's `races` of the call).
    races: dict[str, int] | None = None


class Tiers:
    """The run's choice of tier per call structure (safe across callback threads)."""

    # Whether a call under `auto` waits for the build it started (tests that are about
    # what follows a build; a run never waits: intercept/builds.py).
    wait_for_builds = False

    def __init__(self, config: Config) -> None:
        self.config = config
        self.mode = Tier(config.tier)
        self._structures = StructureKeys()
        self._built: dict[str, Built | str] = {}
        self._ineligible: dict[str, str | None] = {}  # structure -> why not, or None
        # Per structure not yet built: the engine's seconds on it (estimated, then measured).
        self._spent: dict[str, float] = {}
        self._compiled_calls: dict[str, int] = {}  # structure -> calls its callback ran
        self._inline_cost: dict[str, float] = {}  # structure -> its compile's estimate
        self._lock = threading.Lock()
        self._builds = Builds(config, lambda key: self._spent.get(key, 0.0))

    def settle(self) -> None:
        """Wait for the builds in flight (tests: the call after them sees their result)."""
        self._builds.settle()

    def attempt(self, params: CallParams, devices: int, never_written: Collection[int],
                operands: Sequence[np.ndarray], results: Sequence[np.ndarray] | None,
                kernel: str) -> TierRun:
        """The call run compiled where the tier may run it (its outputs None when the
        engine runs it, with the reason). `--tier compiled` and a call the tier cannot
        run: `TierRefused`, one line naming `kernel` (its name and where it is defined)."""
        refused = self.refusal(params, devices, never_written)
        if refused is None:
            return self.run(params, operands, results)
        if self.mode is Tier.COMPILED:
            raise TierRefused(f"--tier compiled: {kernel} cannot run compiled: {refused}")
        return TierRun(None, refused)

    def refusal(self, params: CallParams, devices: int,
                never_written: Collection[int]) -> str | None:
        """Why the compiled tier will not run this call (None: it will try)."""
        if self.mode is Tier.ENGINE:
            return "--tier engine"
        if devices != 1 or never_written:  # (the operands' own: asked per call)
            return ineligible(params, self.config, devices, never_written)
        key = self._structures.of(params)
        found = self._ineligible.get(key, "")
        if found == "":  # the structure's static answer, once per structure
            found = self._ineligible[key] = ineligible(params, self.config, 1)
        if found is not None:
            return found
        built = self._executable(params)
        return built if isinstance(built, str) else None

    def run(self, params: CallParams, operands: Sequence[np.ndarray],
            results: Sequence[np.ndarray] | None) -> TierRun:
        """The call run compiled (after `refusal` said it may be): its outputs (in
        `results` where given) when the verdict is clear."""
        built = self._executable(params)
        assert not isinstance(built, str)
        with jax.default_device(engine_device()):
            # Lent, not copied, where XLA's alignment allows (the operands are XLA's own
            # buffers, read-only and valid for the call: intercept/hostcall.py).
            lent = lend_to_engine(operands)
            outputs, verdict, coverage = built.executable(*lent)
            # (through numpy: `int()` of a jax.Array costs 50-100 us more)
            bits = int(np.asarray(verdict))
            covered = np.asarray(coverage)
        if bits:
            return TierRun(None, f"the compiled run saw {describe_verdict(bits)}")
        arrays = [np.asarray(o) for o in outputs]
        key = self._structures.of(params)
        with self._lock:
            self._compiled_calls[key] = self._compiled_calls.get(key, 0) + 1
        if results is not None:
            for k, (target, value) in enumerate(zip(results, arrays)):
                if target.shape == value.shape and target.dtype == value.dtype:
                    target[...] = value
                    arrays[k] = target
        return TierRun(arrays, "", self.coverage(covered))

    def coverage(self, covered: np.ndarray) -> dict[str, int] | None:
        """Races on: what the compiled run's race check covered (the call's `races`)."""
        return ({"accesses_checked": int(covered[0]), "longest_history": int(covered[1])}
                if self.config.races else None)

    def inline_function(self, params: CallParams) -> Compiled | None:
        """The structure's computation as a function to trace into the script's program
        (intercept/inline.py), once the tier runs this structure and its calls have paid
        about that compile in host callbacks (`--tier compiled` too: both ways run the
        tier's computation); None: its calls go through the host callback. Asked at every
        run of a program holding the kernel: cheap."""
        key = self._structures.of(params)
        cost = self._inline_cost.get(key)
        if cost is None:
            cost = self._inline_cost[key] = inline_seconds(describe(params))
        if self._compiled_calls.get(key, 0) * _HOST_CALL_SECONDS < cost:
            return None
        if self.refusal(params, 1, ()) is not None:
            return None
        built = self._executable(params)
        return None if isinstance(built, str) else built.function

    def engine_ran(self, params: CallParams, seconds: float, reason: str) -> None:
        """The engine ran a call for `reason`, in `seconds`: a structure not compiled
        because it was small counts toward its compile."""
        if reason in (_NOT_YET, _BUILDING):
            key = self._structures.of(params)
            with self._lock:
                self._spent[key] = self._spent.get(key, 0.0) + seconds

    def _executable(self, params: CallParams) -> Built | str:
        """The structure's build, or why the engine runs this call. `auto`: once the
        engine has spent about a compile on it, built in the background (`_BUILDING` until
        ready); `compiled`: built here, at once, unless a build of it was abandoned."""
        key = self._structures.of(params)
        found = self._built.get(key)
        if found is not None:
            return found
        if self.mode is Tier.AUTO:
            spent = self._spent.get(key)
            if spent is None:
                spent = self._spent[key] = engine_seconds(describe(params))
            if spent < compile_seconds(describe(params)):
                return _NOT_YET
            found = self._builds.poll(key, params)
            if found is None and self.wait_for_builds:
                self._builds.settle()
                found = self._builds.poll(key, params)
            if found is None:
                return _BUILDING
        else:
            found = self._builds.abandoned(key)
            if found is None:
                try:
                    with jax.default_device(engine_device()):
                        found = build(params, self.config)
                except Unsupported as exc:
                    found = str(exc)
                # The compile's freed memory back to the OS before the call runs: left in
                # the heap, it sat under the call's buffers (add at grid 4096, races on:
                # peak RSS 455-468 -> 418-444 MiB; benchmarks/README.md, "Latest results").
                return_freed_memory(at_once=True)
        with self._lock:
            self._built[key] = found
        return found
