"""One schedule of a pallas_call on a modelled TPU: buffers per device and core, the actors
and the scheduler, and the outputs handed back (the schedules tried, the second-fill re-run
and lost revisits are explore.py's).

The static description of the call is in describe.py, the run-time state in state.py, the
BlockSpec pipeline of each core in pipeline.py. Findings come from the checkers the call
is given (engine/events.py); nothing is printed.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np
from jax.extend.core import Jaxpr, Var

from pallas_check.config import Config
from pallas_check.engine.call import carried as carried_semaphores
from pallas_check.engine.call.describe import (Operand, _block_indices, logical_keys,
                                               _grid_points, _operand, _read_only,
                                               core_mesh_axes, dimension_semantics,
                                               is_semaphore_aval, kernel_arg_names, resolve_grid,
                                               sparsecore_mesh, split_grid, SparseCoreMesh,
                                               unvisited_blocks)
from pallas_check.engine.call.carried import CarriedDma
from pallas_check.jaxbridge import keys
from pallas_check.jaxbridge.call import CallParams, CallDescription, describe
from pallas_check.engine.call.pipeline import _core_body, _finish_dmas
from pallas_check.engine.dma.engine import CellKey
from pallas_check.engine.call import event_data, serial, unraced
from pallas_check.engine.events import ActorsDeclared
from pallas_check.engine.verdicts import CallEnded, OutputUnwritten
from pallas_check.engine.jaxpr.halts import CallHalted, EngineBug, KernelError
from pallas_check.engine.jaxpr.mosaic_limits import NotLowered
from pallas_check.engine.jaxpr.program import current_frames
from pallas_check.engine.memory.buffer import (Buffer, MemorySpace, RefView, fill_value,
                                               memory_space_name)
from pallas_check.engine.runtime.scheduler import Actor, Deadlock
from pallas_check.engine.call.parts import (CallInputs, CallPlace, Handover, ScheduleRun,
                                            SemaphoreLayout, Simulation)
from pallas_check.engine.call.state import CallState, CoreContext
# Every rule module, imported for its rules to register themselves (jaxpr/registry.py):
from pallas_check.engine.rules import access, control, conversions, debug, mxu, random, semaphore  # noqa: F401
from pallas_check.engine.rules import dma as dma_rules  # noqa: F401
from pallas_check.engine.rules import sparsecore  # noqa: F401


@dataclasses.dataclass
class _Layout:
    """What one simulation of a call needs to know of its params, computed once."""

    jaxpr: Jaxpr
    call: CallDescription  # the call's params, read by the bridge
    grid: tuple[int, ...]
    arg_names: list[str]
    out_to_in: dict[int, int]  # output index -> the input it is aliased to
    block_vars: list[Var]
    scratch_vars: list[Var]
    points: np.ndarray
    program_axes: list[int]
    core_axes: tuple[str, ...]
    core_steps: list[np.ndarray]  # per core: its grid steps (indices into points)
    sem_in: frozenset[int] = frozenset()  # inputs / outputs that are semaphores
    sem_out: frozenset[int] = frozenset()
    # Outputs whose array itself lives in VMEM or SMEM (an out_shape of `pltpu.VMEM(...)`).
    resident_out: frozenset[int] = frozenset()
    # The SparseCore mesh of a SparseCore kernel (None: TensorCores).
    sparsecore: SparseCoreMesh | None = None
    # The outputs' abstract values (shape, dtype, memory space).
    out_avals: Sequence[Any] = ()

    @property
    def n_in(self) -> int:
        return self.call.num_inputs

    @property
    def first(self) -> int:
        """Where the inputs start among the kernel's parameters (after scalar prefetch)."""
        return self.call.num_scalars


def _layout(params: CallParams, grid: tuple[int, ...], config: Config) -> _Layout:
    call = describe(params)
    jaxpr = call.kernel
    n_in, n_out, first = call.num_inputs, call.num_outputs, call.num_scalars
    # input index (counting the scalar-prefetch operands, as pallas_call does) -> output
    aliases = {i - first: o for i, o in call.aliases}
    points = _grid_points(grid)
    core_axes = core_mesh_axes(params)
    if core_axes:
        # A core_map / pl.kernel over a TensorCore mesh: every point of the mesh is a core
        # of its own with private VMEM (at once, or in turn on one TensorCore: serial.py).
        core_steps = [np.array([i]) for i in range(len(points))]
    else:
        core_steps = split_grid(points, grid, dimension_semantics(params), config.cores)
    block_vars = jaxpr.invars[first: first + n_in + n_out]
    sems = [k for k, var in enumerate(block_vars) if _is_semaphore_ref(var.aval)]
    return _Layout(jaxpr, call, grid, kernel_arg_names(jaxpr),
                   {o: i for i, o in aliases.items()}, block_vars,
                   jaxpr.invars[first + n_in + n_out:], points, call.program_axes,
                   core_axes, core_steps, frozenset(k for k in sems if k < n_in),
                   frozenset(k - n_in for k in sems if k >= n_in),
                   frozenset(j for j, aval in enumerate(call.out_avals)
                             if memory_space_name(getattr(aval, "memory_space", None),
                                                  MemorySpace.HBM)
                             in (MemorySpace.VMEM, MemorySpace.SMEM)),
                   sparsecore_mesh(params), call.out_avals)


def _is_semaphore_ref(aval: object) -> bool:
    """An operand that is a semaphore (passed from one call to another)."""
    return (is_semaphore_aval(aval) or memory_space_name(
        getattr(aval, "memory_space", None)) == MemorySpace.SEMAPHORE)


# Per device, the outputs; the state of the run; per device, the outputs' written-shadows.
Simulated = tuple[list[list[np.ndarray]], CallState, list[list[np.ndarray | None]]]


def simulate_schedule(call: CallInputs, run: ScheduleRun) -> Simulated:
    """One schedule of the call on every device: buffers, one actor per core, the run."""
    params, config, mesh = call.params, run.config, call.mesh
    described = describe(params)
    # With --trace, the reporting run's timeline goes where the session says, as it runs.
    live = run.live
    sink = (live.trace(config.seed) if live is not None and live.trace is not None
            and run.report and config.timeline else None)
    # The call's operands are: dynamic grid bounds, scalar prefetch, inputs.
    num_bounds = described.num_grid_bounds
    grid = resolve_grid(described.grid, [np.asarray(b) for b in call.device_operands[0][:num_bounds]])
    layout = _layout(params, grid, config)
    state = CallState(
        Simulation(config, run.fill, call.kernel, call.call_index, run.report, run.checking,
                   sink),
        CallPlace(mesh, described.mesh, described.collective_id,
                  len(layout.core_steps), described.num_scalars + described.num_inputs,
                  SemaphoreLayout(layout.sem_in, layout.sem_out, layout.out_to_in,
                                  layout.n_in), len(layout.points),
                  bool(layout.core_axes) and layout.sparsecore is None
                  and serial.runs_serially(config, len(layout.core_steps))),
        Handover(run.carried, call.addresses, run.address_probe, run.perturb))
    if live is not None:
        live.simulating(state)
    contexts: list[CoreContext] = []
    actors: list[Actor] = []
    device_hbm_outputs: list[list[Buffer]] = []
    blocked_outputs: dict[int, Operand] = {}  # by HBM buffer id: blocks never visited
    # Per device: its HBM inputs by operand address (one CPU device), and all of them.
    by_address: dict[int, tuple[dict[int, Buffer], list[Buffer]]] = {}
    for device in range(mesh.num_devices):
        operands = logical_keys(layout.block_vars[:layout.n_in], layout.first, [
            np.asarray(x) for x in list(call.device_operands[device])[num_bounds:]])
        scalars = operands[: layout.first]
        hbm_inputs, hbm_outputs = _device_hbm(state, layout, device, operands[layout.first:],
                                              run.results, call.never_written)
        device_hbm_outputs.append(hbm_outputs)
        if layout.sem_in:  # where DMAs carried in may land (engine/call/carried.py)
            data = [b for b in hbm_inputs if b.space != MemorySpace.SEMAPHORE]
            by_address[device] = ({a.__array_interface__["data"][0]: buf for a, buf in
                                   zip(operands[layout.first:], hbm_inputs)
                                   if buf.space != MemorySpace.SEMAPHORE}
                                  if call.addresses is not None else {}, data)
        templates = _operand_templates(layout, hbm_inputs, hbm_outputs, scalars)
        blocked_outputs.update((op.hbm.id, op) for op in templates if op.is_output)
        shared_scratch: dict[tuple[object, ...], Buffer] = {}
        cores: list[Actor] = []
        for core_id in range(len(layout.core_steps)):
            ctx, actor = _core(state, layout, device, core_id, scalars, templates,
                               shared_scratch)
            contexts.append(ctx)
            cores += [actor] if actor is not None else []
        if state.serial_cores:  # one TensorCore runs the mesh's cores in turn (serial.py)
            serial.chain(cores, state.tell if state.feeds.takes(serial.SerialStart) else None)
        actors += cores
    if state.arriving:  # DMAs started by an earlier call, carried in by a semaphore
        first_ctx = {ctx.device_id: ctx for ctx in reversed(contexts)}
        for dma in carried_semaphores.arrive(state, first_ctx, by_address):
            if not dma.copied:  # the DMA mode may make it an actor of its own
                actor = state.dma_policy.arrived(first_ctx[
                    dma.dst_sem[0].device if dma.src_sem is None else dma.src_sem[0].device],
                    dma)
                if actor is not None:
                    actors.append(actor)
    _run(state, contexts, actors, device_hbm_outputs)
    return _outputs(state, device_hbm_outputs, layout.out_to_in, blocked_outputs,
                    layout.arg_names[layout.first + layout.n_in:])


def _device_hbm(state: CallState, layout: _Layout, device: int, arrays: list[np.ndarray],
                results: Sequence[np.ndarray] | None,
                never_written: frozenset[int] = frozenset()
                ) -> tuple[list[Buffer], list[Buffer]]:
    """A device's HBM arrays for the inputs and outputs, shared by its cores (an input
    in `never_written` is never-written memory: the fill, no element written)."""
    names, first, n_in, fill = layout.arg_names, layout.first, layout.n_in, state.fill_mode
    hbm_inputs = []
    for i, a in enumerate(arrays[:n_in]):
        if i in layout.sem_in:  # its counts (and DMAs in flight) from an earlier call
            buf = carried_semaphores.semaphore_in(state, names[first + i], a, device)
            if i not in layout.out_to_in.values():
                state.semaphores.append(buf)  # its last holder: checked at the end
            hbm_inputs.append(state.register(buf, device, None, ("hbm", i)))
            continue
        # Shared with the operand until written (copy on write): most kernels never write
        # their inputs, and an input may be as large as the device's memory.
        buf = (Buffer.filled(names[first + i], MemorySpace.HBM, a.shape, a.dtype, fill)
               if i in never_written else
               Buffer(names[first + i], MemorySpace.HBM, _read_only(a), True))
        hbm_inputs.append(state.register(buf, device, None, ("hbm", i)))
    hbm_outputs: list[Buffer] = []
    for j in range(layout.call.num_outputs):
        if j in layout.out_to_in:
            hbm_outputs.append(hbm_inputs[layout.out_to_in[j]])
            continue
        name, aval = names[first + n_in + j], layout.out_avals[j]
        if j in layout.sem_out:  # a new semaphore, returned: its count starts at 0
            buf = Buffer(name, MemorySpace.SEMAPHORE, np.zeros(aval.shape, np.int64), True)
            hbm_outputs.append(state.register(buf, device, None, ("hbm", n_in + j)))
            continue
        if (results is not None and state.mesh.num_devices == 1
                and results[j].shape == tuple(aval.shape)
                and results[j].dtype == keys.held_dtype(aval.dtype)):
            data = results[j]  # the call's own output buffer: filled, simulated in
            data[...] = fill_value(aval.dtype, fill)
            buf = Buffer(name, MemorySpace.HBM, data, written=False)
        else:
            buf = Buffer.filled(name, MemorySpace.HBM, aval.shape, keys.held_dtype(aval.dtype),
                                fill)
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
    for k, (var, bm) in enumerate(zip(layout.block_vars, layout.call.blocks)):
        is_output = k >= n_in
        hbm = hbm_outputs[k - n_in] if is_output else hbm_inputs[k]
        op = _operand(layout.arg_names[first + k], first + k, is_output, bm, hbm, var)
        if (k - n_in in layout.sem_out) if is_output else (k in layout.sem_in):
            op.kernel_space = MemorySpace.HBM  # the semaphore itself, never copied
        elif op.kernel_space != MemorySpace.HBM or not bm.trivial_window:
            # An HBM operand with a window (vmap adds a squeezed batch dim) is seen by the
            # kernel as that window of the array, moved at every grid step.
            op.block_indices = _block_indices(bm, layout.points, scalars)
        templates.append(op)
    return templates


def _core(state: CallState, layout: _Layout, device: int, core_id: int,
          scalars: list[np.ndarray], templates: list[Operand],
          shared_scratch: dict[tuple[object, ...], Buffer]) -> tuple[CoreContext, Actor | None]:
    """One core: its context, its kernel arguments, and the actor walking its grid steps.
    Each core has its own SMEM copy of the scalar prefetch, its own VMEM blocks and
    scratch; VMEM_SHARED scratch is one buffer for all cores of a device (of a SparseCore
    for its subcores)."""
    coords = [int(c) for c in layout.points[core_id]] if layout.core_axes else []
    my_steps, fill, sc = layout.core_steps[core_id], state.fill_mode, layout.sparsecore
    ctx = CoreContext(state, layout.grid, layout.program_axes, device_id=device,
                      core_id=core_id, num_devices=state.mesh.num_devices,
                      local_name=sc.actor_name(*coords) if sc is not None else None)
    if layout.core_axes:
        ctx.core_coords = dict(zip(layout.core_axes, coords))
    kernel_args: list[RefView] = [
        RefView(state.register(
            Buffer(layout.arg_names[i], MemorySpace.SMEM, np.array(v), True, owner=ctx.actor),
            device, core_id, ("smem", i)))
        for i, v in enumerate(scalars)
    ]
    core_operands: list[Operand] = []
    for k, template in enumerate(templates):
        op = dataclasses.replace(template)
        if op.block_indices is not None:
            op.block_indices = op.block_indices[my_steps]
        if op.kernel_space == MemorySpace.HBM:
            # The whole array, or (under vmap) its window, which the pipeline moves at
            # every grid step: HBM is shared by the cores, never copied to VMEM.
            kernel_args.append(RefView(op.hbm))
        elif (shared := _aliased_whole_block(layout, k, op, core_operands)) is not None:
            op.vmem = shared  # the aliased input's own VMEM buffer (see there)
            kernel_args.append(RefView(op.vmem))
        else:
            ref_shape = tuple(sz for sz, sq in zip(op.block_sizes, op.squeezed) if not sq)
            op.vmem = state.register(
                Buffer.filled(op.name, op.kernel_space, ref_shape, op.hbm.data.dtype, fill,
                              owner=ctx.actor),
                device, core_id, ("block", k))
            op.vmem.is_output = op.is_output
            kernel_args.append(RefView(op.vmem))
        core_operands.append(op)
    scratch_names = layout.arg_names[layout.first + layout.n_in + layout.call.num_outputs:]
    for position, (var, name) in enumerate(zip(layout.scratch_vars, scratch_names)):
        space = memory_space_name(getattr(var.aval, "memory_space", None))
        if space == MemorySpace.VMEM_SHARED:
            # One per device; on SparseCores one per SparseCore, shared by its subcores.
            key = ("scratch", position) if sc is None else ("scratch", position, coords[0])
            if key not in shared_scratch:
                shared_scratch[key] = state.register(
                    state.allocate(var.aval, name), device, None, key)
            kernel_args.append(RefView(shared_scratch[key]))
        else:
            buf = state.allocate(var.aval, name, owner=ctx.actor)
            kernel_args.append(RefView(state.register(buf, device, core_id,
                                                      ("scratch", position))))
    unraced.bind(state, layout.jaxpr, kernel_args)
    ctx.private_buffers = [arg.buffer for arg in kernel_args[len(scalars):]
                           if arg.buffer.space in (MemorySpace.VMEM, MemorySpace.SMEM)
                           and arg.buffer.core is not None]
    my_points = layout.points[my_steps]
    if not len(my_points):
        return ctx, None
    return ctx, Actor(ctx.actor, _core_body(ctx, layout.jaxpr, kernel_args, core_operands,
                                            my_points))


def _aliased_whole_block(layout: _Layout, k: int, op: Operand,
                         core_operands: list[Operand]) -> Buffer | None:
    """An output array that lives in VMEM (or SMEM: an out_shape of `pltpu.VMEM(...)`),
    aliased to an input, of a grid-less call: XLA gives the call one buffer in that memory
    for both, so the kernel's output ref is its input ref (a kernel may leave it to an
    input's DMA to fill, as JAX's async copies into VMEM do). None for any other operand
    (its own block buffer, as the pipeline of an HBM array gives it)."""
    j = k - layout.n_in
    if (not op.is_output or j not in layout.out_to_in or j not in layout.resident_out
            or len(layout.points) != 1):
        return None
    source = core_operands[layout.out_to_in[j]]
    if (source.vmem is None or source.kernel_space != op.kernel_space
            or source.block_sizes != op.block_sizes
            or tuple(op.block_sizes) != tuple(op.hbm.shape) or any(op.squeezed)):
        return None
    return source.vmem


def _run(state: CallState, contexts: list[CoreContext], actors: list[Actor],
         device_hbm_outputs: list[list[Buffer]] | None = None) -> None:
    """Every actor to its end (or a deadlock), then what the end of a kernel checks."""
    ctx = contexts[0]
    if state.feeds.actors_declared:
        # DMAs carried in from an earlier call run alongside every core from the start.
        state.tell(ActorsDeclared(frozenset({*(actor.name for actor in actors),
                                             *(dma.actor_name for dma in state.carried_dmas
                                               if not dma.copied)}),
                                  tuple((c.device_id, c.core_id, c.local_name)
                                        for c in contexts)))
    if state.feeds.dma_moved:
        for dma in state.carried_landed:  # landed in an earlier call, waited in this one
            state.tell(event_data.dma_moved(dma, landed=True)._replace(replayed=True))
    if state.feeds.kernel_entered and state.mesh.num_devices > 1:
        unraced.kernel_entries(state, contexts)
    unraced.decide(state)  # (the buffers no race can involve: after DMAs carried in)
    try:
        # Scalar segments (engine/jaxpr/scalar.py) run on numpy scalars, whose integer
        # overflow wraps as XLA's does; numpy would warn at each: silenced once for the whole call.
        with np.errstate(over="ignore"):
            state.scheduler.run(actors)
    except Deadlock as deadlock:
        state.tell(event_data.deadlocked(deadlock, state.scheduler, ctx.grid_point,
                                         serial.deadlock_note(state)))
        state.halted()
    except CallHalted:  # its finding is already there; the kernel never finished either
        state.halted()
    except (KernelError, EngineBug) as exc:  # what the kernel printed up to there still shows
        exc.prints = state.prints
        raise
    except NotLowered:
        raise
    except Exception as exc:  # ours, outside any equation: say which actor, and where
        failure = _outside_equations(state, contexts, exc)
        failure.prints = state.prints
        raise failure from exc
    finally:
        # Each core's context holds the call: no longer listed by it once every actor is
        # done, so that the call is freed by reference counting, not a cyclic collection.
        state.contexts.clear()
    # Semaphores the call returns carry their DMAs in flight to the call that takes them.
    carried = _depart(state, ctx, device_hbm_outputs or [])
    # After a deadlock the kernel never finished: leaks and unwritten outputs would be
    # consequences of the hang, not defects of their own.
    _finish_dmas(ctx, report=not state.unfinished)
    if not state.unfinished and state.feeds.call_ended:
        state.tell(CallEnded(ctx.actor, state.mesh.num_devices,
                             event_data.semaphores_left(state.sync, state.semaphores)))
    state.save_carried()
    state.semaphore_handles.update(
        (buf.id, carried_semaphores.handles_out(state, buf, carried))
        for outputs in device_hbm_outputs or [] for buf in outputs
        if buf.space == MemorySpace.SEMAPHORE)


def _depart(state: CallState, ctx: CoreContext,
            device_hbm_outputs: list[list[Buffer]]) -> dict[CellKey, list[CarriedDma]]:
    """The DMAs in flight carried by the semaphores the call returns (engine/call/carried.py);
    those semaphores are checked where their last holder ends, not here."""
    sem_out = state.layout_semaphores[1]
    if not sem_out:
        return {}
    # Each output with the address of its XLA buffer (one CPU device; elsewhere None: a
    # later call finds it by what it holds).
    addresses = state.output_addresses
    outputs: list[tuple[Buffer, int | None]] = []
    for hbm_outputs in device_hbm_outputs:
        for j, buf in enumerate(hbm_outputs):
            outputs.append((buf, addresses[j] if addresses is not None else None))
    returned = {buf.id for buf, _ in outputs if buf.space == MemorySpace.SEMAPHORE}
    state.semaphores[:] = [buf for buf in state.semaphores if buf.id not in returned]
    return carried_semaphores.depart(state, ctx, outputs,
                                     _whole_output_blocks(state, device_hbm_outputs))


def _whole_output_blocks(state: CallState, device_hbm_outputs: list[list[Buffer]]
                         ) -> dict[int, Buffer]:
    """Output blocks as large as their output (a grid-less `memory_space=VMEM` output), by
    buffer id, with that output's HBM buffer: a DMA that lands in such a block after the
    kernel's write-back lands in the output the call returns too."""
    n_in = state.layout_semaphores[3]
    mirrors: dict[int, Buffer] = {}
    for device, hbm_outputs in enumerate(device_hbm_outputs):
        for j, hbm in enumerate(hbm_outputs):
            for core in range(state.cores_per_device):
                block = state.registry.get((device, core, ("block", n_in + j)))
                if block is not None and block.shape == hbm.shape:
                    mirrors[block.id] = hbm
    return mirrors


def _outside_equations(state: CallState, contexts: list[CoreContext],
                       exc: Exception) -> EngineBug:
    """An exception of ours raised by an actor outside the equations' own handling: the
    core's BlockSpec pipeline around a grid step, the making of its program, a DMA landing
    (`--dma random`)."""
    running = state.scheduler.running if state.scheduler is not None else None
    if running is None:
        return EngineBug(exc)
    ctx = next((c for c in contexts if c.actor == running.name), None)
    if ctx is None:  # a DMA of its own (its name says where it was started)
        return EngineBug(exc, where=f"in {running.name}")
    at = f" at grid point {ctx.grid_point}" if ctx.grid_point is not None else ""
    if ctx.eqn is not None:
        return EngineBug(exc, ctx.eqn.primitive.name, current_frames(ctx),
                         where=f"in {running.name}{at}")
    return EngineBug(exc, where=f"in {running.name}{at}, outside the kernel's equations:"
                                " its BlockSpec pipeline or program")


def _outputs(state: CallState, device_hbm_outputs: list[list[Buffer]],
             out_to_in: dict[int, int], blocked: dict[int, Operand],
             out_names: Sequence[str] = ()) -> Simulated:
    """Per device, the outputs and their written-shadows; never-written outputs reported
    (with the blocks of a `blocked` output, by its buffer id, that no grid point visits)."""
    outputs, written = [], []
    for hbm_outputs in device_hbm_outputs:
        device_written: list[np.ndarray | None] = []
        for j, buf in enumerate(hbm_outputs):
            if j in out_to_in or buf.space == MemorySpace.SEMAPHORE:
                device_written.append(None)
                # An aliased output starts as its input, all written: what is not now was
                # overwritten with never-written memory (a block written back whole).
                if j in out_to_in and not buf.fully_written and not state.unfinished:
                    name = out_names[j] if j < len(out_names) else buf.name
                    state.tell(OutputUnwritten(name, ~buf.written, clobbered=True))
                continue
            device_written.append(buf.shadow)
            if not buf.fully_written and not state.unfinished:
                op = blocked.get(buf.id)
                blocks = unvisited_blocks(op) if op is not None else None
                state.tell(OutputUnwritten(buf.name, ~buf.written) if op is None or blocks is None
                           else OutputUnwritten(buf.name, ~buf.written, op.block_sizes, *blocks))
        # The call's buffers die with it: hand their arrays over rather than copy them.
        # A semaphore leaves as handles to its value (engine/call/carried.py).
        outputs.append([state.semaphore_handles.get(buf.id, buf.data) if
                        buf.space == MemorySpace.SEMAPHORE else buf.data
                        for buf in hbm_outputs])
        written.append(device_written)
    return outputs, state, written

