"""A checking session: the handler behind the interception, and what it collected.

One session per run of a user script (or per test under the pytest plugin). Engine state
belongs to one call; the session only keeps findings, per-call summaries and the first
error the engine raised (so the runner can tell our failure from the user's).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import threading
import time
from typing import Any, Callable, Iterator, Sequence

import numpy as np

import jax

from pallas_check.process import children
from pallas_check.intercept import empties
from pallas_check.process import interrupts
from pallas_check.intercept import outer
from pallas_check.jaxbridge.call import describe as describe_call
from pallas_check.intercept.call_filter import CallFilter
from pallas_check.checkers import CHECKERS, Checkers, RaceCounting
from pallas_check.config import Config, TpuGeneration, parse_generations
from pallas_check.deliver.delivery import write_stdout
from pallas_check.engine.call import capacity, describe, explore
from pallas_check.engine.call.explore import CallSetting
from pallas_check.engine.call.exposures import never_written
from pallas_check.engine.call.carried import forget, never_taken
from pallas_check.engine.call.describe import MeshInfo, resolve_grid
from pallas_check.engine.jaxpr.halts import EngineBug, KernelError
from pallas_check.engine.runtime import progress
from pallas_check.engine.runtime import disk_cache
from pallas_check.engine.runtime.backend import engine_device
from pallas_check.engine.runtime.inflight import InFlight
from pallas_check.engine.runtime.rendezvous import Rendezvous, RendezvousTimeout
from pallas_check.config.errors import EngineFailure, PallasCheckError
from pallas_check.findings.finding import CallSummary, Finding, FindingStore, KernelInfo, SourceFrame
from pallas_check.intercept.generations import GenerationRun
from pallas_check.process.host_memory import collector_paused, return_freed_memory
from pallas_check.intercept.patched_lowering import intercepted
from pallas_check.intercept.inline import InlineCalls
from pallas_check.intercept.judge import Judge, Program, replay_call
from pallas_check.tpu_compile.stage import CompileRecorder
from pallas_check.jaxbridge import program_store
from pallas_check.jaxbridge.chip_arithmetic import chip_arithmetic
from pallas_check.intercept.tpu_info import questions, simulated_tpu
from pallas_check.intercept.unchecked import Unchecked
from pallas_check.intercept.tiers import COMPILED, ENGINE, Tiers, TierRun
from pallas_check.intercept.chip import ChipCheck
from pallas_check.intercept.call_record import (UNNAMED, Call, CallInFlight, LastCall,
                                                kernel_or_unnamed)


_SESSIONS = itertools.count()


def _write_print(line: str) -> None:
    """A kernel's print, written where the script's own prints go now (nowhere when that
    stdout is closed or its reader has gone: no failure of the call)."""
    write_stdout(line + "\n")



class Session:
    """Collects findings from every intercepted pallas_call of a run."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.store = FindingStore()
        self.calls: list[CallSummary] = []
        self.engine_error: str | None = None
        # The exit code of that error when it is not ours but a request refused (exit 2).
        self.error_code: int | None = None
        # Ctrl-C arrived while a call was being simulated (the host callback runs on the
        # main thread); JAX hands the script its own runtime error instead.
        self.interrupted = False
        self._counter = itertools.count()
        self._lock = threading.Lock()
        # Multi-device calls: where each device's callback meets the others'.
        self._meeting_point = Rendezvous()
        # What outlives one call on a TPU (barrier semaphore counts), carried call to call.
        self.carried: dict = {}
        # progress(call_index, kernel, schedules_done, schedules_total), e.g. a progress bar.
        self.progress: Callable[[int, str, int, int], None] | None = None
        self.calls_in_flight = 0  # host callbacks inside handle_call now (the watchdog)
        # Calls being simulated, by index: what a report made while they run lists.
        self._in_flight: dict[int, CallInFlight] = {}
        # With --trace: report/trace.py's TraceWriter (the runner's), which each call's
        # timeline (engine/timeline.py) is written to as it is recorded.
        self.trace: Any = None
        # Where the kernels' own prints go, a line at a time (engine/events.KernelPrint's
        # `line()`): the script's stdout as it is when the call returns, which the runner
        # sends to stderr when a JSON or SARIF report owns stdout.
        self.print_sink: Callable[[str], None] = _write_print
        # --compile: each call's params and operand shapes, compiled after the script
        # (tpu_compile.stage.compile_session).
        # --kernel / --calls: which calls are checked (intercept/call_filter.py); None: every call.
        self.call_filter: CallFilter | None = CallFilter(config.kernels, config.calls)
        # How a call they do not check runs (intercept/unchecked.py).
        self.unchecked = Unchecked(config, self.call_filter)
        self._xla_paths = self.unchecked.xla_paths
        if not self.call_filter.active:
            self.call_filter = None
        # In a process the script started during a run (process/children.py): where each call's
        # findings go for the run's owner to report; or, in one forked after JAX started,
        # why no call can run there.
        self.findings_for_owner: children.ChildFindings | None = None
        self.refused: str | None = None
        self.compile_recorder: CompileRecorder | None = None
        # Several --tpu generations with --compile or --tpu-all: how a further generation
        # is traced (intercept/generations.py; None: the first run's trace is compiled for each), and
        # what each further generation's run did (its note in the report).
        self.retrace: Callable[[TpuGeneration], GenerationRun] | None = None
        self.traces: dict[str, dict] = {}
        # tpu_info.questions() when the run began: none asked since, no trace depends on
        # the chip, and the first generation's trace is every generation's.
        self.questions_from: int | None = None
        # What a call leaves undecided in its outputs is judged by what the program keeps
        # of it (intercept/judge.py): those findings wait there for the jitted call around the call.
        self.judge = Judge(self)
        # Which way each checked call runs (intercept/tiers.py): compiled, or the engine.
        self.tiers = Tiers(config)
        # Per thread, its last call simulated and checked: (index, never-written output
        # elements); None after any other (commands/diff.py compares outputs by it).
        self._last = threading.local()
        if config.compile:
            self.compile_recorder = CompileRecorder()
        # The first generation's compile at each call's lowering (intercept/chip.py).
        self.chip = ChipCheck(config, self.refused_by_chip)

    # The interception handler.
    def handle_call(self, params: dict, operands: Sequence[np.ndarray], device: int = 0,
                    mesh_axes: tuple = (), results: Sequence[np.ndarray] | None = None,
                    call_site: SourceFrame | None = None) -> list[np.ndarray]:
        """The call's outputs; `results`, when given, are the buffers they are returned in
        (one device: the engine simulates the outputs in them)."""
        if self.refused is not None:  # forked after JAX started: the engine would hang
            raise children.ForkedProcessError(self.refused)
        with self._lock:
            self.calls_in_flight += 1
        progress.beat()
        try:
            mesh = MeshInfo(tuple(mesh_axes))
            if mesh.num_devices == 1:
                return self._simulate(params, [operands], mesh, results, call_site)[0]
            return self._rendezvous(params, operands, device, mesh, call_site)
        finally:
            with self._lock:
                self.calls_in_flight -= 1
            progress.beat()
            self.tell_owner()

    def last_call(self) -> LastCall | None:
        """This thread's last call, when it was simulated and checked (see LastCall); None
        for a call passed through or re-run."""
        last: LastCall | None = getattr(self._last, "call", None)
        return last

    def tell_owner(self) -> None:
        """In a process the script started (process/children.py): what this process has found so
        far, for the run's owner (after each call, and when intercept/judge.py keeps a finding)."""
        if self.findings_for_owner is not None:
            self.findings_for_owner.write(list(self.calls), self.findings)

    def _rendezvous(self, params: dict, operands: Sequence[np.ndarray], device: int,
                    mesh: MeshInfo, call_site: SourceFrame | None = None) -> list[np.ndarray]:
        try:
            return self._meeting_point.meet(
                device, mesh.num_devices, operands,
                lambda ordered: self._simulate(params, ordered, mesh, None, call_site))
        except RendezvousTimeout as exc:
            if self._fail(str(exc)):  # every waiting device times out: list the call once
                with self._lock:
                    index = next(self._counter)
                self._record(Call(index, kernel_or_unnamed(params), params, [operands],
                                   time.perf_counter(), mesh, call_site), 0, failed=True)
            raise EngineFailure(self.engine_error) from exc

    def _simulate(self, params: dict, device_operands: list, mesh: MeshInfo,
                  results: Sequence[np.ndarray] | None = None,
                  call_site: SourceFrame | None = None) -> list[list[np.ndarray]]:
        self._last.call = None
        program, outside = self.judge.program()
        key = program.key(params) if program is not None else None
        if program is not None and program.replay is not None:  # a re-run of the program
            assert key is not None
            return replay_call(self, program, key, params, device_operands, mesh, results)
        with self._lock:
            index = next(self._counter)
        if self.call_filter is not None and not self._checked(params, device_operands[0]):
            return self._pass_through(params, device_operands, mesh, results, index,
                                      call_site)
        # Unnamed until named: a failure from here on still lists the call.
        call = Call(index, UNNAMED, params, device_operands, time.perf_counter(), mesh,
                     call_site)
        live = InFlight(max(1, self.config.schedules))
        # Races on: what race checking covered goes in the call's summary.
        checkers = RaceCounting() if self.config.races else CHECKERS
        try:
            kernel = call.kernel = describe.kernel_info(params)
            if self.trace is not None and self.config.timeline:
                live.trace = functools.partial(self.trace.sink, kernel.name, index)
            with self._lock:  # listed, with what it found, if the run stops inside it
                self._in_flight[index] = CallInFlight(call, live)
            if self.compile_recorder is not None:
                self.compile_recorder.record(index, params, device_operands[0], mesh.axes,
                                             kernel, call_site)
            # Checked against the chips of --tpu before anything is allocated: a call no
            # chip could run is reported and not simulated (engine/call/capacity.py).
            fits = self.chip.fits(capacity.check(params, self.config, kernel, index, call_site),
                                  params, device_operands[0], mesh.axes)
            self.store.extend(fits.findings)
            if not fits.simulated:
                with self._lock:
                    self._in_flight.pop(index, None)  # never started: not in flight
                outputs = capacity.unsimulated_outputs(params, device_operands,
                                                       self.config.uninit.value, results)
                self._record(call, len(fits.findings),
                             tier=(ENGINE, "not run: it does not fit the chip"))
                return outputs
            never = (empties.never_written_inputs(params, device_operands[0])
                     if mesh.num_devices == 1 else frozenset())
            where = f" at {kernel.file}:{kernel.line}" if kernel.file else ""
            compiled = self.tiers.attempt(params, mesh.num_devices, never, device_operands[0],
                                          results, f"{kernel.name}{where}")
            if compiled.outputs is not None:  # a clear verdict: every output written
                self._last.call = LastCall(index, {})
                return self._compiled_done(call, program, outside, key, compiled)
            started = time.perf_counter()
            result = self._run_engine(call, results, checkers, live, never)
            self.tiers.engine_ran(params, time.perf_counter() - started, compiled.reason)
        except KeyboardInterrupt:
            self._stopped(index)
            raise
        except Exception as exc:
            raise self._failed(exc, call) from exc
        finally:
            progress.call_ended(index)  # off the progress line (engine/runtime/progress.py)
        with self._lock:
            if self._in_flight.pop(index, None) is None:
                return result.outputs  # the run's report already listed it, interrupted
        self.store.extend(self.judge.received(program, outside, key, index, result.seed,
                                              result.findings, result.exposures))
        self._write_prints(result.prints)
        self._last.call = LastCall(index, never_written(result.exposures), result.drew_random)
        if result.timeline is not None and self.trace is not None:
            self.trace.keep(result.timeline, [*fits.findings, *result.findings])
        return_freed_memory()
        self._record(call, len(result.findings) + len(fits.findings),
                     races=checkers.race_cost() if isinstance(checkers, RaceCounting) else None,
                     unused_memory=result.unused_memory, tier=(ENGINE, compiled.reason))
        return result.outputs

    def refused_by_chip(self, params: dict, kernel: KernelInfo, call_site: SourceFrame | None,
                         mesh_axes: tuple, finding: Callable[[int], Finding]) -> int:
        """A call the chip's compiler refused as it was lowered (intercept/chip.py): listed
        as not run, with its finding; its index."""
        with self._lock:
            index = next(self._counter)
        self.store.extend([finding(index)])
        self._record(Call(index, kernel, params, [[]], time.perf_counter(),
                           MeshInfo(tuple(mesh_axes)), call_site), 1,
                     tier=(ENGINE, f"not run: {self.chip.generation.value}'s compiler refuses it"))
        return index

    def _compiled_done(self, call: Call, program: Program | None, outside: str,
                       key: tuple[Any, ...] | None, compiled: TierRun
                       ) -> list[list[np.ndarray]]:
        """A call the compiled tier ran with a clear verdict: no findings, its outputs."""
        with self._lock:
            self._in_flight.pop(call.index, None)
        self.store.extend(self.judge.received(program, outside, key, call.index, 0, [], []))
        self._record(call, 0, tier=(COMPILED, ""), races=compiled.races)
        assert compiled.outputs is not None
        return [compiled.outputs]

    def record_inline(self, program: Program | None, outside: str, params: dict,
                      kernel: KernelInfo, call_site: SourceFrame | None,
                      operands: Sequence[np.ndarray], races: dict[str, int] | None) -> None:
        """A call run inline whose run stands (intercept/inline.py), in `program` (or
        none, `outside` saying why): listed as the compiled tier's, numbered and keyed in
        its program as a handled call is."""
        with self._lock:
            index = next(self._counter)
        key = program.key(params) if program is not None else None
        call = Call(index, kernel, params, [list(operands)], time.perf_counter(),
                     MeshInfo(()), call_site)
        self._compiled_done(call, program, outside, key, TierRun([], "", races))
        self.tell_owner()

    def _run_engine(self, call: Call, results: Sequence[np.ndarray] | None,
                    checkers: Checkers, live: InFlight,
                    never: frozenset[int]) -> explore.DevicesResult:
        """The checked call, named, simulated by the engine (explore.DevicesResult)."""
        params, device_operands, mesh, index = (call.params, call.device_operands,
                                                call.mesh, call.index)
        name, call_site = call.kernel.name, call.call_site
        run_call_devices = explore.run_call_devices  # looked up per call (tests replace it)
        progress = self.progress
        # The engine's own compiled pieces run on a CPU client of its own, whatever the
        # script's backend is, and never queue behind the script's work.
        with jax.default_device(engine_device()), collector_paused():
            return run_call_devices(
                params, device_operands, self.config, index, CallSetting(
                    mesh, self.carried, checkers,
                    (lambda done, total: progress(index, name, done, total))
                    if progress is not None else None, call_site, never),
                results=results, live=live)

    def checks(self, params: dict, operands: Sequence[np.ndarray]) -> bool:
        """Whether --kernel and --calls have this call checked (True without filters)."""
        return self.call_filter is None or self._checked(params, operands)

    def findings_dropped(self, index: int, count: int) -> None:
        """`count` findings of call `index` turned out not to be defects (intercept/judge.py)."""
        with self._lock:
            for summary in reversed(self.calls):
                if summary.index == index:
                    summary.findings = max(0, summary.findings - count)
                    return

    def _checked(self, params: dict, operands: Sequence[np.ndarray]) -> bool:
        """Whether --kernel and --calls have this call checked (intercept/call_filter.py)."""
        assert self.call_filter is not None
        return self.call_filter.checks(kernel_or_unnamed(params), params, operands)

    def _pass_through(self, params: dict, device_operands: list, mesh: MeshInfo,
                      results: Sequence[np.ndarray] | None, index: int,
                      call_site: SourceFrame | None) -> list[list[np.ndarray]]:
        """A call the filters do not check: run by the engine with every check off (no
        race detection, no second fill, no capacity check, one schedule), its findings
        dropped; its outputs and the kernel's prints are the script's as in a checked
        run, and a kernel that fails still fails the run."""
        call = Call(index, kernel_or_unnamed(params), params, device_operands,
                     time.perf_counter(), mesh, call_site)
        try:
            outputs, prints = self.unchecked.outputs(params, device_operands, mesh, results,
                                                     index, self.carried)
        except Exception as exc:
            raise self._failed(exc, call) from exc
        self._write_prints(prints)
        return outputs

    def _write_prints(self, prints: list) -> None:
        """What a call's kernel printed (engine/events.KernelPrint), in simulated order."""
        for kernel_print in prints:
            self.print_sink(kernel_print.line())

    def _failed(self, exc: Exception, call: Call) -> BaseException:
        """What a call that raised `exc` raises: KeyboardInterrupt when the user stopped
        the run (a Ctrl-C that reached the engine through a callback of the kernel's
        comes back as JAX's error), else EngineFailure with our one-line error (exit 4),
        the call listed as failed."""
        if interrupts.requested():
            self._stopped(call.index)
            return KeyboardInterrupt()
        with self._lock:
            self._in_flight.pop(call.index, None)
        self._write_prints(getattr(exc, "prints", []))  # what the kernel printed till then
        if isinstance(exc, KernelError):
            self._fail(f"{call.kernel.name}: {exc.located()}")
        elif isinstance(exc, PallasCheckError) and not isinstance(exc, EngineFailure):
            if self._fail(str(exc)):  # the user's request refused (--tier compiled): its code
                self.error_code = exc.exit_code
        else:  # our bug: keep the message, the runner exits 4
            # An EngineBug says itself what failed and where (the primitive, the line).
            what = str(exc) if isinstance(exc, EngineBug) else f"{type(exc).__name__}: {exc}"
            self._fail(f"internal error while simulating {call.kernel.name}: {what}")
        self._record(call, 0, failed=True)
        return EngineFailure(self.engine_error)

    def _stopped(self, index: int) -> None:
        """The user stopped the run inside call `index` (this thread simulates it)."""
        self.interrupted = True
        self.stop_in_flight(index)

    def stop_in_flight(self, index: int | None = None) -> None:
        """The calls being simulated when the run stops (Ctrl-C, SIGTERM, the watchdog),
        or call `index`: each listed as interrupted with how far it got, the findings it
        made until then kept and merged as usual."""
        with self._lock:
            if index is None:
                stopped = list(self._in_flight.values())
                self._in_flight.clear()
            else:
                stopped = [c for c in (self._in_flight.pop(index, None),) if c is not None]
        if index is None:
            self.judge.abandon("the run stopped before the jitted call returned")
        for stopped_call in stopped:
            findings = stopped_call.live.findings_so_far()
            self.store.extend(findings)
            self._record(stopped_call.call, len(findings),
                         progress=stopped_call.live.progress())

    def _record(self, call: Call, findings: int, *, failed: bool = False,
                progress: dict[str, int] | None = None, races: dict[str, int] | None = None,
                unused_memory: list | None = None, tier: tuple[str, str] = (ENGINE, "")
                ) -> None:
        """The call's line in the report (a call the engine failed on is marked so, and a
        call the run stopped in, with its `progress`; `races`: what race checking covered)."""
        kernel = call.kernel
        try:
            described = describe_call(call.params)
            grid = resolve_grid(described.grid,
                                call.device_operands[0][:described.num_grid_bounds])
        except Exception:  # noqa: BLE001 - a failed call may not even have a grid
            grid = ()
        with self._lock:
            self.calls.append(CallSummary(call.index, kernel.name, kernel.file, kernel.line,
                                          grid, time.perf_counter() - call.started, findings,
                                          call.mesh.num_devices, call.call_site, failed,
                                          interrupted=progress is not None,
                                          progress=progress or {}, races=races or {},
                                          unused_memory=unused_memory or [],
                                          tier=tier[0], tier_reason=tier[1]))

    def _fail(self, message: str) -> bool:
        """Keep the run's first engine error; whether this was it."""
        with self._lock:
            if self.engine_error is None:
                self.engine_error = message
                return True
            return False

    def finish(self) -> None:
        """The end of the script: a semaphore a call returned and no later call took
        still holds its count and its DMAs (engine/call/carried.py); reported once."""
        self.judge.abandon("the run ended before the jitted call returned")
        with self._lock:
            values = never_taken(self.carried)
            forget(self.carried)
        self.store.extend(CHECKERS.semaphores_never_taken(values))

    @property
    def findings(self) -> list[Finding]:
        return self.store.all()

    def adopt(self, calls: Sequence[CallSummary], findings: Sequence[Finding]) -> None:
        """Calls another process of the run checked (process/children.py), and their findings:
        listed in this session's report, numbered after its own calls."""
        renumbered = {}
        for call in sorted(calls, key=lambda c: c.index):
            with self._lock:
                renumbered[call.index] = next(self._counter)
                self.calls.append(dataclasses.replace(call, index=renumbered[call.index]))
        self.store.extend(dataclasses.replace(f, call_index=renumbered.get(f.call_index,
                                                                           f.call_index))
                          for f in findings)

    def _forked(self) -> None:
        """First thing in a process the script forked during a run (process/children.py): the
        owner's calls and findings are the owner's to report; this process's own calls
        go to the owner -- or, forked after JAX started, are refused (JAX would hang)."""
        self._lock = threading.Lock()  # (another thread of the parent may have held it)
        self.store = FindingStore()
        self.calls, self._in_flight = [], {}
        self.calls_in_flight, self.engine_error, self.progress = 0, None, None
        self._meeting_point = type(self._meeting_point)()
        if children.jax_refused():
            self.refused = children.FORKED_JAX
        elif (folder := children.run_folder()) is not None:
            self.findings_for_owner = children.ChildFindings(folder)

    @contextlib.contextmanager
    def install(self) -> Iterator[None]:
        """Intercept pallas_calls into this session, with the simulated TPU answering
        kernels that ask which chip they run on."""
        inline = InlineCalls(self)
        # What its programs depend on: its settings (a test's plain programs stay compiled
        # for the next test: patched_lowering.install); with several generations it alone
        # (a trace kept from another would ask no chip question: intercept/generations.py).
        several = len(parse_generations(self.config.tpu)) > 1
        programs = ("session", next(_SESSIONS)) if several else repr(self.config)
        with (intercepted(self.handle_call, fills_results=True, call_sites=True,
                          inline=inline.lowered, chip=self.chip.check if self.chip.on else None,
                          programs=programs),
              simulated_tpu(self.config.tpu, self.config.cores),
              chip_arithmetic(self.config.chip_arithmetic, self.config.chip_functions),
              children.undone_in_child(self._forked)):
            self.questions_from = questions()
            outer.install(self.judge, inline.kernel_options)
            empties.install()
            # The script's plain programs compiled once across runs (jaxbridge/program_store.py).
            store = disk_cache.script_programs()
            if store is not None:
                program_store.install(store)
            try:
                yield
            finally:
                if store is not None:
                    program_store.uninstall()
                empties.uninstall()
                outer.uninstall()
