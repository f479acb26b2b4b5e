"""Exploring one pallas_call: the schedules tried (seeds), the call skipped when Mosaic
would not lower it, the second-fill re-run that decides uninitialized reads, revisits whose
work is lost, and the results handed back to the session. One schedule's simulation is
simulate.py's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from pallas_check.jaxbridge.call import CallParams, describe
from pallas_check.config import Config, TpuGeneration, UninitFill, parse_generations
from pallas_check.engine.call import carried as carried_semaphores
from pallas_check.engine.call import exposures
from pallas_check.engine.call.exposures import Exposure
from pallas_check.engine.call import revisit
from pallas_check.engine.call.describe import (MeshInfo, SINGLE_DEVICE, kernel_arg_names,
                                               kernel_info)
from pallas_check.engine.call.parts import CallInputs, ScheduleRun
from pallas_check.engine.call.simulate import Simulated, simulate_schedule
from pallas_check.engine.call.state import CallState
from pallas_check.engine.events import (CallFacts, Checking, Feeds, FindingList, KernelPrint,
                                        default_checking)
from pallas_check.engine.verdicts import (CallSkipped, DmaAddressCompared, FillsCompared,
                                          RevisitLost)
from pallas_check.engine.jaxpr.halts import KernelError
from pallas_check.engine.jaxpr.mosaic_limits import (NotLowered, foreign_compiler_params,
                                                     kernel_not_lowered, sparsecore_kernel)
from pallas_check.engine.memory import usage
from pallas_check.engine.memory.buffer import Buffer, MemorySpace, fill_value, memory_space_name
from pallas_check.engine.runtime import caches
from pallas_check.engine.runtime.inflight import InFlight
from pallas_check.engine.timeline import Timeline
from pallas_check.engine.seam import AddressProbe
from pallas_check.findings.finding import Finding, SourceFrame, UnusedMemory


@dataclasses.dataclass
class CallResult:
    outputs: list[np.ndarray]
    findings: list[Finding]


@dataclasses.dataclass
class DevicesResult:
    outputs: list[list[np.ndarray]]  # per device, per output
    findings: list[Finding]
    timeline: Timeline | None = None  # the timeline of the schedule kept (--trace)
    # What the kernel printed in the schedule kept (simulated order).
    prints: list[KernelPrint] = dataclasses.field(default_factory=list)
    # The note of memory never touched (findings.UnusedMemory), over every schedule tried;
    # `untouched`: one schedule's, before it becomes the note (engine/memory/usage.py).
    unused_memory: list[UnusedMemory] = dataclasses.field(default_factory=list)
    untouched: usage.Untouched | None = None
    # The output elements the kernel did not decide in the outputs returned (exposures.py),
    # and the seed of the schedule those outputs come from (a re-run of the program
    # replays that schedule: pallas_check/intercept/judge.py).
    exposures: list[Exposure] = dataclasses.field(default_factory=list)
    seed: int = 0
    # A core drew from its hardware PRNG in the schedule the outputs come from: their
    # values are ours, not a chip's (engine/rules/random.py).
    drew_random: bool = False


@dataclasses.dataclass(frozen=True)
class CallSetting:
    """Where and how a call is checked, beside its operands and options: the devices of
    `mesh` together; `carried`, what outlives a call on a TPU (barrier semaphores,
    semaphores passed between calls), updated in place; the listeners (`checkers`, the
    default checkers when None); who is told of each schedule done (`progress`: done,
    total); `call_site`, the script's line that made the call (where a refusal of the
    call's own parameters points); `never_written`, the inputs (by position among the
    call's inputs) whose every element is memory nobody wrote (an array made by
    `jnp.empty`), held as the fill."""

    mesh: MeshInfo = SINGLE_DEVICE
    carried: dict[tuple[object, ...], object] = dataclasses.field(default_factory=dict)
    checkers: Checking | None = None
    progress: Callable[[int, int], None] | None = None
    call_site: SourceFrame | None = None
    never_written: frozenset[int] = frozenset()


def run_call(params: dict[str, Any], operands: Sequence[np.ndarray], config: Config,
             call_index: int, checkers: Checking | None = None) -> CallResult:
    """Simulate one pallas_call on one device; return its outputs and findings."""
    result = run_call_devices(params, [operands], config, call_index,
                              CallSetting(checkers=checkers))
    return CallResult(result.outputs[0], result.findings)


def run_call_devices(params: dict[str, Any], device_operands: Sequence[Sequence[np.ndarray]],
                     config: Config, call_index: int, setting: CallSetting = CallSetting(),
                     *, results: Sequence[np.ndarray] | None = None,
                     live: InFlight | None = None) -> DevicesResult:
    """Simulate one pallas_call on every device of the setting's mesh together (one
    operand list per device; see `CallSetting`); `live` is kept up to date with what the
    call has found so far (engine/runtime/inflight.py).

    `results` (one device): the buffers the call's outputs are returned in; the first
    schedule simulates the outputs' HBM in them, so that the outputs are not copied.

    With `config.schedules` > 1 the call is simulated under seeds seed, seed+1, ...
    until one schedule has findings (or all of them, with keep_going); each finding
    carries the seed that replays it.

    A kernel that Mosaic does not lower (engine/jaxpr/mosaic_limits.py) never runs on a TPU:
    the call is skipped (`_skipped`) with one `compile-error` finding, and the run goes on."""
    checkers = setting.checkers if setting.checkers is not None else default_checking()
    site = setting.call_site
    refused = (foreign_compiler_params(params, (site,) if site else ())
               or _not_lowered(params, parse_generations(config.tpu)[0]))
    # On one CPU device the outputs' XLA buffers are lent to us: where they are is how a
    # later call recognises a DMA's destination among its operands (engine/call/carried.py).
    call = CallInputs(params, device_operands, kernel_info(params), call_index, setting.mesh,
                      [r.__array_interface__["data"][0] for r in results]
                      if results is not None else None, setting.never_written)
    if refused is None:
        try:
            return _explore(call, config, setting,
                            ScheduleRun(config, config.uninit.value, True, checkers,
                                        results=results, live=live))
        except NotLowered as exc:  # met while running: a spelling the static look missed
            refused = exc
    return _skipped(call, config, results, checkers, refused)


def _explore(call: CallInputs, config: Config, setting: CallSetting,
             first: ScheduleRun) -> DevicesResult:
    """The call's schedules (see `run_call_devices`): `first` is the first one's run."""
    schedules = max(1, config.schedules)
    carried, progress, live = setting.carried, setting.progress, first.live
    findings: list[Finding] = []
    seen: dict[tuple[object, ...], int] = {}  # merge key -> in how many schedules it appeared
    result: DevicesResult | None = None
    chosen_carried = dict(carried)
    tried = 0
    untouched: usage.Untouched | None = None  # the kernel's memory no schedule so far touched
    for i in range(schedules):
        trial_carried = dict(carried)
        trial = _one_schedule(call, dataclasses.replace(
            first, config=dataclasses.replace(config, seed=config.seed + i),
            carried=trial_carried, results=first.results if i == 0 else None))
        tried += 1
        if trial.untouched is None or i == 0 or untouched is None:
            # a schedule that did not finish leaves what is never touched unknown
            untouched = trial.untouched if i == 0 else None
        else:
            untouched = usage.intersect(untouched, trial.untouched)
        if progress is not None:
            progress(i + 1, schedules)
        if result is None or (trial.findings and not findings):
            result, chosen_carried = trial, trial_carried
        # Every occurrence is kept (the store counts them); a defect already seen under an
        # earlier seed is not reported again under a later one.
        keys: set[tuple[object, ...]] = set()
        for finding in trial.findings:
            if finding.seed is None:
                finding.seed = config.seed + i
            key = finding.merge_key()
            if key not in seen:
                findings.append(finding)
            keys.add(key)
        for key in keys:
            seen[key] = seen.get(key, 0) + 1
        if live is not None:
            live.schedule_done(findings, seen, i + 1)
        if findings and not config.keep_going:
            break
    assert result is not None
    if schedules > 1:
        for finding in findings:
            finding.schedules = (seen[finding.merge_key()], tried)
    carried.clear()
    carried.update(chosen_carried)
    carried_semaphores.drop_taken(carried)
    return DevicesResult(result.outputs, findings, result.timeline, result.prints,
                         usage.notes(untouched) if untouched is not None else [],
                         exposures=result.exposures, seed=result.seed,
                         drew_random=result.drew_random)


_refusals = caches.BoundedCache(256)  # a kernel jaxpr -> what Mosaic does not lower in it


def mosaic_refusal(params: CallParams, config: Config) -> NotLowered | None:
    """Why Mosaic would not lower the call for the generation simulated (its compiler
    params, or something in its kernel), or None: a call it refuses is skipped with a
    `compile-error` finding."""
    return (foreign_compiler_params(params)
            or _not_lowered(params, parse_generations(config.tpu)[0]))


def _not_lowered(params: CallParams, tpu: TpuGeneration) -> NotLowered | None:
    """What in the call's kernel Mosaic does not lower for `tpu` (looked for once per
    jaxpr and generation)."""
    described = describe(params)
    jaxpr = described.kernel
    return _refusals.for_object(jaxpr, tpu, lambda: kernel_not_lowered(
        jaxpr, kernel_arg_names(jaxpr),
        lambda aval: memory_space_name(getattr(aval, "memory_space", None)),
        sparsecore_kernel(described.mesh), tpu))


def _skipped(call: CallInputs, config: Config, results: Sequence[np.ndarray] | None,
             checkers: Checking, refused: NotLowered) -> DevicesResult:
    """A call that does not compile for a TPU, skipped: its one finding, and the outputs of
    a kernel that wrote nothing -- never-written memory (the fill of `--uninit`), an output
    aliased to an input that input, unchanged -- so that the script runs on and the rest of
    its calls are checked."""
    params, device_operands = call.params, call.device_operands
    described = describe(params)
    first = described.num_grid_bounds + described.num_scalars
    aliases = {o: i - described.num_scalars for i, o in described.aliases}
    fill = config.uninit.value
    outputs: list[list[np.ndarray]] = []
    for operands in device_operands:
        inputs = list(operands)[first:]
        device_outputs = []
        for j, aval in enumerate(described.out_avals):
            if j in aliases:
                device_outputs.append(np.array(inputs[aliases[j]]))
            elif (results is not None and len(device_operands) == 1
                  and results[j].shape == tuple(aval.shape)
                  and results[j].dtype == np.dtype(aval.dtype)):
                results[j][...] = fill_value(aval.dtype, fill)
                device_outputs.append(results[j])
            else:
                device_outputs.append(
                    Buffer.filled("", MemorySpace.HBM, aval.shape, aval.dtype, fill).data)
        outputs.append(device_outputs)
    found = FindingList()
    facts = CallFacts(call.kernel, call.call_index, config.seed, False)
    skipped = CallSkipped(refused.message, refused.buffer, refused.memory_space,
                          refused.operation, refused.mosaic, refused.frames)
    for take in Feeds(checkers.listeners(facts, found)).call_skipped:
        take(skipped)
    return DevicesResult(outputs, list(found))


def _one_schedule(call: CallInputs, run: ScheduleRun) -> DevicesResult:
    """One schedule (`run`: its reporting simulation), then what is decided after it by
    simulating the call again: the second fill, a DMA's address, lost revisits."""
    config, carried, params = run.config, run.carried, call.params
    main_fill = run.fill
    outputs, state, written = simulate_schedule(call, run)
    state.run_ended()
    # A DMA the call stopped at (a slice size no part of its ref holds) after reads of
    # never-written memory: the re-run with the other fill says whether its address
    # depends on them (the DMA's ranges differ there, or it is never reached).
    unbounded = state.unbounded_dma
    probe: AddressProbe | None = ({unbounded.id: None} if unbounded is not None
                                  and unbounded.reads and config.check_uninit_outputs
                                  else None)
    compare_outputs = (state.uninit_reads and config.check_uninit_outputs
                       and not config.skip_floats and not state.unfinished)
    other_fill = "zero" if main_fill == UninitFill.NAN.value else "nan"
    names = _output_names(params)
    found = ([] if state.unfinished else
             exposures.unwritten(names, outputs, written, other_fill))
    if compare_outputs or probe is not None:
        other_outputs, _, _ = simulate_schedule(call, ScheduleRun(
            config, other_fill, False, run.checking, dict(carried), address_probe=probe))
        if probe is not None:
            assert unbounded is not None  # the probe is made for it only
            state.tell(DmaAddressCompared(unbounded, probe[unbounded.id],
                                          tuple(state.uninit_reads)))
    if compare_outputs:
        flat = [o for dev in outputs for o in dev]
        flat_other = [o for dev in other_outputs for o in dev]
        flat_written = [w for dev in written for w in dev]
        flat_names = [name for _ in outputs for name in names]
        state.tell(FillsCompared(tuple(flat_names), tuple(flat), tuple(flat_other),
                                 tuple(flat_written), tuple(state.uninit_reads)))
        found += exposures.dependent(names, outputs, other_outputs, written)
    if state.revisits and not state.unfinished:

        def rerun(perturb: revisit.Perturbation) -> Simulated:
            return simulate_schedule(call, ScheduleRun(config, main_fill, False, state.checking,
                                                       dict(carried), perturb=perturb))

        for lost in _lost_revisits(state, outputs, rerun):
            state.tell(_revisit_lost(lost))
    return DevicesResult(outputs, list(state.findings), state.timeline, state.prints,
                         untouched=_untouched(state), exposures=found, seed=config.seed,
                         drew_random=state.drew_random)


def _output_names(params: CallParams) -> list[str]:
    """The kernel's names of the call's outputs."""
    call = describe(params)
    first_output = call.num_scalars + call.num_inputs
    return kernel_arg_names(call.kernel)[first_output: first_output + call.num_outputs]


def _revisit_lost(lost: revisit.Lost) -> RevisitLost:
    r = lost.record
    return RevisitLost(r.name, tuple(r.block), tuple(r.first_point), tuple(r.last_point),
                       tuple(lost.earlier_point), tuple(r.inputs), r.restored, lost.by_flow,
                       lost.elements, lost.index_range, r.actor, tuple(r.frames))


def _untouched(state: CallState) -> usage.Untouched | None:
    """The kernel's memory this schedule never touched; None when the kernel did not
    finish (a deadlock, a halt): what it would have touched is unknown."""
    if state.unfinished or state.ever_written is None:
        return None
    # (a read of lanes no memory holds has no range and no buffer: nothing to clear)
    return usage.untouched(state.registry, state.ever_written,
                           ((r.buffer, r.memory_space, r.index_range)
                            for r in state.uninit_reads if r.index_range is not None))


# Candidates decided one at a time (ROUNDS re-runs each): perturbing one first visit can
# change another revisited block through state the kernel carries (a cursor in scratch),
# which would hide the other's loss. Beyond this many, one joint run per round.
SEPARATE_AT_MOST = 8


def _lost_revisits(state: CallState, outputs: list[list[np.ndarray]],
                   rerun: Callable[[revisit.Perturbation], Simulated]) -> list[revisit.Lost]:
    """Output blocks revisited after other blocks whose first visit's work is lost.

    Decided as uninitialized memory is, by running the call again (only calls where such
    a revisit happened): the input blocks the first visit consumed are perturbed for its
    steps, and a block whose final value does not change under any perturbation
    (revisit.ROUNDS) keeps nothing of that visit. Each candidate alone (up to
    SEPARATE_AT_MOST), so that one's perturbation does not mask another's loss. Where no
    run can tell (the first visit consumed no input block, a re-run did not finish, or
    floats are skipped), what the last visit wrote decides."""
    config = state.config
    records = state.revisits
    undecided = [r for r in records if not r.perturbable]
    candidates = [r for r in records if r.perturbable]
    if config.skip_floats or not config.check_uninit_outputs:
        undecided, candidates = list(records), []
    groups = ([[r] for r in candidates] if len(candidates) <= SEPARATE_AT_MOST
              else [candidates])
    lost: list[revisit.Lost] = []
    for group in groups:
        kept, unfinished = _perturbed_rounds(state, outputs, rerun, group)
        lost += kept
        undecided += unfinished
    lost += [x for x in map(revisit.lost_by_writes, undecided) if x is not None]
    return lost


def _perturbed_rounds(state: CallState, outputs: list[list[np.ndarray]],
                      rerun: Callable[[revisit.Perturbation], Simulated],
                      candidates: list[revisit.RevisitRecord]
                      ) -> tuple[list[revisit.Lost], list[revisit.RevisitRecord]]:
    """The revisit rounds for candidates perturbed together: (lost, undecided)."""
    first_output = state.first_output
    # a first visit's end -> its fingerprints
    prints: dict[tuple[int, tuple[int, ...]], set[bytes | None]] = {}
    for round_ in range(revisit.ROUNDS):
        if not candidates:
            break
        capture = {r.first_end for r in candidates} if round_ else None
        perturb = revisit.Perturbation(revisit.perturbation_points(candidates), round_,
                                       capture)
        try:
            other, other_state, _ = rerun(perturb)
        except KernelError:  # perturbed data the kernel cannot run on (an index, a size)
            other_state = None
        if other_state is None or other_state.unfinished:
            return [], candidates
        candidates = [r for r in candidates
                      if not revisit.block_changed(r, outputs, other, first_output)]
        for key in capture or ():
            prints.setdefault(key, set()).add(perturb.fingerprints.get(key))
    # A first visit whose result did not depend on its inputs lost nothing (a step that
    # skips its tile): only one whose result did, and that the final block forgets, is lost.
    return [revisit.lost_by_flow(r) for r in candidates
            if len(prints.get(r.first_end, ())) > 1], []
