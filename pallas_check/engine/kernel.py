"""One pallas_call on a modelled TPU: schedule exploration, the second-fill re-run, and the
simulation of one schedule (buffers per device and core, actors, the scheduler).

The static description of the call is in call.py, the run-time state in state.py, the
BlockSpec pipeline of each core in pipeline.py. Findings come from the checkers the call
is given (events.py); nothing is printed.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import numpy as np

from pallas_check.config import Config, UninitFill
from pallas_check.engine import memory, progress, revisit, rules, sync  # noqa: F401  (rules register themselves)
from pallas_check.engine.memory import Buffer, MemorySpace, RefView
from pallas_check.engine.evaluate import CallHalted, KernelError
from pallas_check.engine.events import Checkers, default_checkers
from pallas_check.engine.inflight import InFlight
from pallas_check.engine.scheduler import Actor, Deadlock, Scheduler
from pallas_check.findings import Finding, KernelInfo, SourceFrame
from pallas_check.sourceinfo import code_line


from pallas_check.engine.call import (  # noqa: F401  (re-exported: the call's API)
    MeshInfo, Operand, SINGLE_DEVICE, _block_indices, _grid_points, _operand, _program_axes,
    _read_only, core_mesh_axes, dimension_semantics, kernel_arg_names, kernel_info,
    memory_space_name, resolve_grid, split_grid)
from pallas_check.engine.pipeline import _core_body, _finish_dmas
from pallas_check.engine.state import CallState, CoreContext  # noqa: F401


@dataclasses.dataclass
class CallResult:
    outputs: list[np.ndarray]
    findings: list[Finding]


@dataclasses.dataclass
class DevicesResult:
    outputs: list[list[np.ndarray]]  # per device, per output
    findings: list[Finding]
    timeline: Any = None  # engine/timeline.py's Timeline of the schedule kept (--trace)


def run_call(params: dict, operands: Sequence[np.ndarray], config: Config,
             call_index: int, checkers: Checkers | None = None) -> CallResult:
    """Simulate one pallas_call on one device; return its outputs and findings."""
    result = run_call_devices(params, [operands], config, call_index, checkers=checkers)
    return CallResult(result.outputs[0], result.findings)


def run_call_devices(params: dict, device_operands: Sequence[Sequence[np.ndarray]],
                     config: Config, call_index: int, mesh: MeshInfo = SINGLE_DEVICE,
                     carried: dict | None = None,
                     progress: Callable[[int, int], None] | None = None,
                     results: Sequence[np.ndarray] | None = None,
                     checkers: Checkers | None = None,
                     live: InFlight | None = None) -> DevicesResult:
    """Simulate one pallas_call on every device of `mesh` together (one operand list per
    device); `carried` holds what outlives a call on a TPU (barrier semaphores); `live`
    is kept up to date with what the call has found so far (engine/inflight.py).

    `results` (one device): the buffers the call's outputs are returned in; the first
    schedule simulates the outputs' HBM in them, so that the outputs are not copied.

    With `config.schedules` > 1 the call is simulated under seeds seed, seed+1, ...
    until one schedule has findings (or all of them, with keep_going); each finding
    carries the seed that replays it."""
    carried = carried if carried is not None else {}
    checkers = checkers if checkers is not None else default_checkers()
    schedules = max(1, config.schedules)
    findings: list[Finding] = []
    seen: dict[tuple, int] = {}  # merge key -> in how many schedules it appeared
    result: DevicesResult | None = None
    chosen_carried = dict(carried)
    tried = 0
    for i in range(schedules):
        trial_carried = dict(carried)
        trial = _one_schedule(params, device_operands,
                              dataclasses.replace(config, seed=config.seed + i), call_index,
                              mesh, trial_carried, results if i == 0 else None, checkers,
                              live)
        tried += 1
        if progress is not None:
            progress(i + 1, schedules)
        if result is None or (trial.findings and not findings):
            result, chosen_carried = trial, trial_carried
        # Every occurrence is kept (the store counts them); a defect already seen under an
        # earlier seed is not reported again under a later one.
        keys: set[tuple] = set()
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
            finding.details["schedules"] = [seen[finding.merge_key()], tried]
    carried.clear()
    carried.update(chosen_carried)
    return DevicesResult(result.outputs, findings, result.timeline)


def _one_schedule(params: dict, device_operands: Sequence[Sequence[np.ndarray]],
                  config: Config, call_index: int, mesh: MeshInfo,
                  carried: dict, results: Sequence[np.ndarray] | None,
                  checkers: Checkers, live: InFlight | None = None) -> DevicesResult:
    kernel = kernel_info(params)
    main_fill = config.uninit.value
    outputs, state, written = _simulate(params, device_operands, config, main_fill, kernel,
                                        call_index, True, mesh, carried, results, checkers,
                                        live=live)
    findings = list(state.findings)
    # A DMA the call stopped at (a slice size no part of its ref holds) after reads of
    # never-written memory: the re-run with the other fill says whether its address
    # depends on them (the DMA's ranges differ there, or it is never reached).
    unbounded = state.unbounded_dma
    probe = ({unbounded.id: None} if unbounded is not None and unbounded.reads
             and config.check_uninit_outputs else None)
    compare_outputs = (state.uninit_reads and config.check_uninit_outputs
                       and not config.skip_floats and not state.unfinished)
    if compare_outputs or probe is not None:
        other_fill = "zero" if main_fill == UninitFill.NAN.value else "nan"
        other_outputs, _, _ = _simulate(params, device_operands, config, other_fill, kernel,
                                        call_index, False, mesh, dict(carried or {}), None,
                                        checkers, probe)
        if probe is not None:
            findings.extend(state.checkers.dma_address_of_two_fills(state, probe[unbounded.id]))
    if compare_outputs:
        flat = [o for dev in outputs for o in dev]
        flat_other = [o for dev in other_outputs for o in dev]
        flat_written = [w for dev in written for w in dev]
        gm = params["grid_mapping"]
        first_output = gm.num_index_operands + gm.num_inputs
        names = kernel_arg_names(params["jaxpr"])[first_output: first_output + gm.num_outputs]
        flat_names = [name for _ in outputs for name in names]
        findings.extend(state.checkers.outputs_of_two_fills(flat_names, state, flat, flat_other,
                                             flat_written, kernel, call_index))
    if state.revisits and not state.unfinished:
        rerun = functools.partial(_simulate, params, device_operands, config, main_fill,
                                  kernel, call_index, False, mesh)
        findings.extend(state.checkers.revisit_lost(state, lost)
                        for lost in _lost_revisits(state, outputs, rerun, carried))
    return DevicesResult(outputs, findings, state.timeline)


def _lost_revisits(state: CallState, outputs: list[list[np.ndarray]],
                   rerun: Callable[..., Any], carried: dict) -> list[revisit.Lost]:
    """Output blocks revisited after other blocks whose first visit's work is lost.

    Decided as uninitialized memory is, by running the call again (only calls where such
    a revisit happened): the input blocks the first visit consumed are perturbed for its
    steps, and a block whose final value does not change under any perturbation
    (revisit.ROUNDS) keeps nothing of that visit. Where no run can tell (the first visit
    consumed no input block, a re-run did not finish, or floats are skipped), what the
    last visit wrote decides."""
    config = state.config
    records = state.revisits
    undecided = [r for r in records if not r.perturbable]
    candidates = [r for r in records if r.perturbable]
    if config.skip_floats or not config.check_uninit_outputs:
        undecided, candidates = list(records), []
    first_output = state.first_output
    prints: dict[tuple, set[bytes | None]] = {}  # a first visit's end -> its fingerprints
    for round_ in range(revisit.ROUNDS):
        if not candidates:
            break
        capture = {r.first_end for r in candidates} if round_ else None
        perturb = revisit.Perturbation(revisit.perturbation_points(candidates), round_,
                                       capture)
        try:
            other, other_state, _ = rerun(dict(carried), None, state.checkers, perturb=perturb)
        except KernelError:  # perturbed data the kernel cannot run on (an index, a size)
            other_state = None
        if other_state is None or other_state.unfinished:
            undecided += candidates
            candidates = []
            break
        candidates = [r for r in candidates
                      if not revisit.block_changed(r, outputs, other, first_output)]
        for key in capture or ():
            prints.setdefault(key, set()).add(perturb.fingerprints.get(key))
    # A first visit whose result did not depend on its inputs lost nothing (a step that
    # skips its tile): only one whose result did, and that the final block forgets, is lost.
    lost = [revisit.lost_by_flow(r) for r in candidates if len(prints.get(r.first_end, ())) > 1]
    lost += [x for x in map(revisit.lost_by_writes, undecided) if x is not None]
    return lost


@dataclasses.dataclass
class _Layout:
    """What one simulation of a call needs to know of its params, computed once."""

    jaxpr: Any
    gm: Any
    grid: tuple[int, ...]
    arg_names: list[str]
    out_to_in: dict[int, int]  # output index -> the input it is aliased to
    block_vars: list[Any]
    scratch_vars: list[Any]
    points: np.ndarray
    program_axes: list[int]
    core_axes: tuple[str, ...]
    core_steps: list[np.ndarray]  # per core: its grid steps (indices into points)

    @property
    def n_in(self) -> int:
        return self.gm.num_inputs

    @property
    def first(self) -> int:
        """Where the inputs start among the kernel's parameters (after scalar prefetch)."""
        return self.gm.num_index_operands


def _layout(params: dict, grid: tuple[int, ...], config: Config) -> _Layout:
    jaxpr, gm = params["jaxpr"], params["grid_mapping"]
    n_in, n_out, first = gm.num_inputs, gm.num_outputs, gm.num_index_operands
    # input index (counting the scalar-prefetch operands, as pallas_call does) -> output
    aliases = {i - first: o for i, o in (params.get("input_output_aliases") or ())}
    points = _grid_points(grid)
    core_axes = core_mesh_axes(params)
    if core_axes:
        # A core_map / pl.kernel over a TensorCore mesh: every point of the mesh is a core
        # of its own, all running at once with private VMEM.
        core_steps = [np.array([i]) for i in range(len(points))]
    else:
        core_steps = split_grid(points, grid, dimension_semantics(params), config.cores)
    return _Layout(jaxpr, gm, grid, kernel_arg_names(jaxpr),
                   {o: i for i, o in aliases.items()},
                   jaxpr.invars[first: first + n_in + n_out],
                   jaxpr.invars[first + n_in + n_out:], points, _program_axes(gm),
                   core_axes, core_steps)


def _simulate(params: dict, device_operands: Sequence[Sequence[np.ndarray]], config: Config,
              fill: str, kernel: KernelInfo, call_index: int, report: bool,
              mesh: MeshInfo = SINGLE_DEVICE, carried: dict | None = None,
              results: Sequence[np.ndarray] | None = None,
              checkers: Checkers | None = None, address_probe: dict | None = None,
              perturb: revisit.Perturbation | None = None, live: InFlight | None = None,
              ) -> tuple[list[list[np.ndarray]], CallState, list[list[np.ndarray | None]]]:
    """One schedule of the call on every device: buffers, one actor per core, the run
    (`address_probe`: DMA ids whose ranges to record, see `_one_schedule`; `perturb`: the
    input blocks a re-run deciding output revisits changes; `live`: told of the state)."""
    gm = params["grid_mapping"]
    state = CallState(config, fill, kernel, call_index, report,
                      checkers if checkers is not None else default_checkers())
    if live is not None:
        live.simulating(state)
    state.address_probe = address_probe
    state.perturb = perturb
    state.first_output = gm.num_index_operands + gm.num_inputs
    state.mesh = mesh
    state.carried = carried if carried is not None else {}
    state.collective_id = getattr(params.get("compiler_params"), "collective_id", None)
    # The call's operands are: dynamic grid bounds, scalar prefetch, inputs.
    num_bounds = gm.num_dynamic_grid_bounds
    grid = resolve_grid(gm.grid, [np.asarray(b) for b in device_operands[0][:num_bounds]])
    layout = _layout(params, grid, config)
    state.cores_per_device = len(layout.core_steps)
    state.steps = progress.grid_steps(call_index, kernel.name)
    state.steps.start(len(layout.points) * mesh.num_devices)
    contexts: list[CoreContext] = []
    actors: list[Actor] = []
    device_hbm_outputs: list[list[Buffer]] = []
    for device in range(mesh.num_devices):
        operands = [np.asarray(x) for x in list(device_operands[device])[num_bounds:]]
        scalars = operands[: layout.first]
        hbm_inputs, hbm_outputs = _device_hbm(state, layout, params, device,
                                              operands[layout.first:], fill, results)
        device_hbm_outputs.append(hbm_outputs)
        templates = _operand_templates(layout, hbm_inputs, hbm_outputs, scalars)
        shared_scratch: dict[int, Buffer] = {}
        for core_id, my_steps in enumerate(layout.core_steps):
            ctx, actor = _core(state, layout, device, core_id, my_steps, scalars, templates,
                               shared_scratch, fill)
            contexts.append(ctx)
            if actor is not None:
                actors.append(actor)
    _run(state, contexts, actors)
    return _outputs(state, device_hbm_outputs, layout.out_to_in)


def _device_hbm(state: CallState, layout: _Layout, params: dict, device: int,
                arrays: list[np.ndarray], fill: str,
                results: Sequence[np.ndarray] | None) -> tuple[list[Buffer], list[Buffer]]:
    """A device's HBM arrays for the inputs and outputs, shared by its cores."""
    names, first, n_in = layout.arg_names, layout.first, layout.n_in
    hbm_inputs = []
    for i, a in enumerate(arrays[:n_in]):
        # Shared with the operand until written (copy on write): most kernels never write
        # their inputs, and an input may be as large as the device's memory.
        buf = Buffer(names[first + i], MemorySpace.HBM, _read_only(a), True)
        hbm_inputs.append(state.register(buf, device, None, ("hbm", i)))
    hbm_outputs: list[Buffer] = []
    for j in range(layout.gm.num_outputs):
        if j in layout.out_to_in:
            hbm_outputs.append(hbm_inputs[layout.out_to_in[j]])
            continue
        name, aval = names[first + n_in + j], params["out_avals"][j]
        if (results is not None and state.mesh.num_devices == 1
                and results[j].shape == tuple(aval.shape)
                and results[j].dtype == np.dtype(aval.dtype)):
            data = results[j]  # the call's own output buffer: filled, simulated in
            data[...] = memory.fill_value(aval.dtype, fill)
            buf = Buffer(name, MemorySpace.HBM, data, written=False)
        else:
            buf = Buffer.filled(name, MemorySpace.HBM, aval.shape, aval.dtype, fill)
        hbm_outputs.append(state.register(buf, device, None, ("hbm", n_in + j)))
    for buf in hbm_outputs:
        buf.is_output = True  # (an input aliased to an output is one too)
    return hbm_inputs, hbm_outputs


def _operand_templates(layout: _Layout, hbm_inputs: list[Buffer], hbm_outputs: list[Buffer],
                       scalars: list[np.ndarray]) -> list[Operand]:
    """The blocked operands of a device, with every grid point's block index (one compiled
    call per operand)."""
    templates: list[Operand] = []
    n_in, first = layout.n_in, layout.first
    for k, (var, bm) in enumerate(zip(layout.block_vars, layout.gm.block_mappings)):
        is_output = k >= n_in
        hbm = hbm_outputs[k - n_in] if is_output else hbm_inputs[k]
        op = _operand(layout.arg_names[first + k], first + k, is_output, bm, hbm, var)
        if op.kernel_space != MemorySpace.HBM or not bm.has_trivial_window():
            # An HBM operand with a window (vmap adds a squeezed batch dim) is seen by the
            # kernel as that window of the array, moved at every grid step.
            op.block_indices = _block_indices(bm, layout.points, scalars)
        templates.append(op)
    return templates


def _core(state: CallState, layout: _Layout, device: int, core_id: int,
          my_steps: np.ndarray, scalars: list[np.ndarray], templates: list[Operand],
          shared_scratch: dict[int, Buffer], fill: str) -> tuple[CoreContext, Actor | None]:
    """One core: its context, its kernel arguments, and the actor walking its grid steps.
    Each core has its own SMEM copy of the scalar prefetch, its own VMEM blocks and
    scratch; VMEM_SHARED scratch is one buffer for all cores of a device."""
    ctx = CoreContext(state, layout.grid, layout.program_axes, device_id=device,
                      core_id=core_id, num_devices=state.mesh.num_devices)
    if layout.core_axes:
        ctx.core_coords = dict(zip(layout.core_axes,
                                   (int(c) for c in layout.points[core_id])))
    kernel_args: list[Any] = [
        RefView(state.register(
            Buffer(layout.arg_names[i], MemorySpace.SMEM, np.array(v), True, owner=ctx.actor),
            device, core_id, ("smem", i)))
        for i, v in enumerate(scalars)
    ]
    core_operands = []
    for k, template in enumerate(templates):
        op = dataclasses.replace(template)
        if op.block_indices is not None:
            op.block_indices = op.block_indices[my_steps]
        if op.kernel_space == MemorySpace.HBM:
            # The whole array, or (under vmap) its window, which the pipeline moves at
            # every grid step: HBM is shared by the cores, never copied to VMEM.
            kernel_args.append(RefView(op.hbm))
        else:
            ref_shape = tuple(sz for sz, sq in zip(op.block_sizes, op.squeezed) if not sq)
            op.vmem = state.register(
                Buffer.filled(op.name, op.kernel_space, ref_shape, op.hbm.data.dtype, fill,
                              owner=ctx.actor),
                device, core_id, ("block", k))
            op.vmem.is_output = op.is_output
            kernel_args.append(RefView(op.vmem))
        core_operands.append(op)
    scratch_names = layout.arg_names[layout.first + layout.n_in + layout.gm.num_outputs:]
    for position, (var, name) in enumerate(zip(layout.scratch_vars, scratch_names)):
        space = memory_space_name(getattr(var.aval, "memory_space", None))
        if space == MemorySpace.VMEM_SHARED:
            if position not in shared_scratch:
                shared_scratch[position] = state.register(
                    state.allocate(var.aval, name), device, None, ("scratch", position))
            kernel_args.append(RefView(shared_scratch[position]))
        else:
            buf = state.allocate(var.aval, name, owner=ctx.actor)
            kernel_args.append(RefView(state.register(buf, device, core_id,
                                                      ("scratch", position))))
    ctx.private_buffers = [arg.buffer for arg in kernel_args[len(scalars):]
                           if arg.buffer.space in (MemorySpace.VMEM, MemorySpace.SMEM)
                           and arg.buffer.core is not None]
    my_points = layout.points[my_steps]
    if not len(my_points):
        return ctx, None
    return ctx, Actor(ctx.actor, _core_body(ctx, layout.jaxpr, kernel_args, core_operands,
                                            my_points))


def _run(state: CallState, contexts: list[CoreContext], actors: list[Actor]) -> None:
    """Every actor to its end (or a deadlock), then what the end of a kernel checks."""
    ctx = contexts[0]
    if state.races is not None:
        state.races.declare(actor.name for actor in actors)
        if state.mesh.num_devices > 1:
            _kernel_entries(state, contexts)
    state.scheduler = Scheduler(seed=state.config.seed)
    state.scheduler.observer = state.timeline  # timeline: steps and blocked spans
    try:
        # Scalar segments (scalar.py) run on numpy scalars, whose integer overflow wraps
        # as XLA's does; numpy would warn at each: silenced once for the whole call.
        with np.errstate(over="ignore"):
            state.scheduler.run(actors)
    except Deadlock as deadlock:
        state.add(state.checkers.deadlocked(state, deadlock, ctx))
        state.unfinished = True
    except CallHalted:  # its finding is already there; the kernel never finished either
        state.unfinished = True
    # After a deadlock the kernel never finished: leaks and unwritten outputs would be
    # consequences of the hang, not defects of their own.
    _finish_dmas(ctx, report=not state.unfinished)
    if not state.unfinished:
        state.checkers.call_ended(state, ctx)
    state.save_carried()


def _kernel_entries(state: CallState, contexts: list[CoreContext]) -> None:
    """Each device's VMEM and SMEM (blocks and scratch) become the kernel's when the device
    enters the kernel; before that they may hold another kernel's data. A remote DMA from
    another device that lands there with no barrier ordering the entry before the copy
    races with the entry, and is reported at the copy's line. The cores of one device
    enter together (the compiler's entry rendezvous), so a DMA between them does not."""
    races = state.races
    assert races is not None
    kernel = state.kernel
    frames = (SourceFrame(kernel.file, kernel.line, kernel.name,
                          code_line(kernel.file, kernel.line)),) if kernel.file else ()
    for ctx in contexts:
        for buf in ctx.private_buffers:
            races.access(ctx.actor, buf, tuple((0, n) for n in buf.shape), True,
                         "kernel entry (its memory becomes the kernel's)", frames, None)
        races.release(ctx.actor, ("kernel entry", ctx.device_id))
    for ctx in contexts:
        races.acquire(ctx.actor, ("kernel entry", ctx.device_id))


def _outputs(state: CallState, device_hbm_outputs: list[list[Buffer]],
             out_to_in: dict[int, int]
             ) -> tuple[list[list[np.ndarray]], CallState, list[list[np.ndarray | None]]]:
    """Per device, the outputs and their written-shadows; never-written outputs reported."""
    outputs, written = [], []
    for hbm_outputs in device_hbm_outputs:
        device_written: list[np.ndarray | None] = []
        for j, buf in enumerate(hbm_outputs):
            if j in out_to_in:
                device_written.append(None)
                continue
            device_written.append(buf.shadow)
            if not buf.fully_written and not state.unfinished:
                state.checkers.output_unwritten(state, buf)
        # The call's buffers die with it: hand their arrays over rather than copy them.
        outputs.append([buf.data for buf in hbm_outputs])
        written.append(device_written)
    return outputs, state, written

