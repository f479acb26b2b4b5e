"""One pallas_call on a modelled TPU: schedule exploration, the second-fill re-run, and the
simulation of one schedule (buffers per device and core, actors, the scheduler).

The static description of the call is in call.py, the run-time state in state.py, the
BlockSpec pipeline of each core in pipeline.py. Findings come from the checkers the call
is given (events.py); nothing is printed.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np
from pallas_check.jaxbridge import jax_core

from pallas_check.config import Config, UninitFill
from pallas_check.engine import memory, rules, sync  # noqa: F401  (rules register themselves)
from pallas_check.engine.memory import Buffer, MemorySpace, RefView
from pallas_check.engine.events import Checkers, default_checkers
from pallas_check.engine.scheduler import Actor, Deadlock, Scheduler
from pallas_check.findings import Finding, KernelInfo


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
                     checkers: Checkers | None = None) -> DevicesResult:
    """Simulate one pallas_call on every device of `mesh` together (one operand list per
    device); `carried` holds what outlives a call on a TPU (barrier semaphores).

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
                              mesh, trial_carried, results if i == 0 else None, checkers)
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
        if findings and not config.keep_going:
            break
    assert result is not None
    if schedules > 1:
        for finding in findings:
            finding.details["schedules"] = [seen[finding.merge_key()], tried]
    carried.clear()
    carried.update(chosen_carried)
    return DevicesResult(result.outputs, findings)


def _one_schedule(params: dict, device_operands: Sequence[Sequence[np.ndarray]],
                  config: Config, call_index: int, mesh: MeshInfo,
                  carried: dict, results: Sequence[np.ndarray] | None,
                  checkers: Checkers) -> DevicesResult:
    kernel = kernel_info(params)
    main_fill = config.uninit.value
    outputs, state, written = _simulate(params, device_operands, config, main_fill, kernel,
                                        call_index, True, mesh, carried, results, checkers)
    findings = list(state.findings)
    if (state.uninit_reads and config.check_uninit_outputs and not config.skip_floats
            and not state.deadlocked):
        other_fill = "zero" if main_fill == UninitFill.NAN.value else "nan"
        other_outputs, _, _ = _simulate(params, device_operands, config, other_fill, kernel,
                                        call_index, False, mesh, dict(carried or {}), None,
                                        checkers)
        flat = [o for dev in outputs for o in dev]
        flat_other = [o for dev in other_outputs for o in dev]
        flat_written = [w for dev in written for w in dev]
        gm = params["grid_mapping"]
        first_output = gm.num_index_operands + gm.num_inputs
        names = kernel_arg_names(params["jaxpr"])[first_output: first_output + gm.num_outputs]
        flat_names = [name for _ in outputs for name in names]
        findings.extend(state.checkers.outputs_of_two_fills(flat_names, state, flat, flat_other,
                                             flat_written, kernel, call_index))
    return DevicesResult(outputs, findings)


def _simulate(params: dict, device_operands: Sequence[Sequence[np.ndarray]], config: Config,
              fill: str, kernel: KernelInfo, call_index: int, report: bool,
              mesh: MeshInfo = SINGLE_DEVICE, carried: dict | None = None,
              results: Sequence[np.ndarray] | None = None,
              checkers: Checkers | None = None,
              ) -> tuple[list[list[np.ndarray]], CallState, list[list[np.ndarray | None]]]:
    jaxpr: jax_core.Jaxpr = params["jaxpr"]
    gm = params["grid_mapping"]
    state = CallState(config, fill, kernel, call_index, report,
                      checkers if checkers is not None else default_checkers())
    state.mesh = mesh
    state.carried = carried if carried is not None else {}
    state.collective_id = getattr(params.get("compiler_params"), "collective_id", None)
    # The call's operands are: dynamic grid bounds, scalar prefetch, inputs.
    num_bounds = gm.num_dynamic_grid_bounds
    grid = resolve_grid(gm.grid, [np.asarray(b) for b in device_operands[0][:num_bounds]])
    device_operands = [list(ops)[num_bounds:] for ops in device_operands]
    arg_names = kernel_arg_names(jaxpr)
    n_in, n_out = gm.num_inputs, gm.num_outputs
    # input index (counting the scalar-prefetch operands, as pallas_call does) -> output
    aliases = {i - gm.num_index_operands: o
               for i, o in (params.get("input_output_aliases") or ())}
    out_to_in = {o: i for i, o in aliases.items()}

    invars = jaxpr.invars
    block_vars = invars[gm.num_index_operands: gm.num_index_operands + n_in + n_out]
    scratch_vars = invars[gm.num_index_operands + n_in + n_out:]
    points = _grid_points(grid)
    program_axes = _program_axes(gm)
    core_axes = core_mesh_axes(params)
    if core_axes:
        # A core_map / pl.kernel over a TensorCore mesh: every point of the mesh is a core
        # of its own, all running at once with private VMEM.
        core_steps = [np.array([i]) for i in range(len(points))]
    else:
        core_steps = split_grid(points, grid, dimension_semantics(params), config.cores)
    contexts: list[CoreContext] = []
    actors: list[Actor] = []
    device_hbm_outputs: list[list[Buffer]] = []

    for device in range(mesh.num_devices):
        operands = [np.asarray(x) for x in device_operands[device]]
        scalars = operands[: gm.num_index_operands]
        arrays = operands[gm.num_index_operands:]
        # HBM arrays for inputs and outputs, shared by the device's cores.
        hbm_inputs = []
        for i, a in enumerate(arrays[:n_in]):
            # Shared with the operand until written (copy on write): most kernels never
            # write their inputs, and an input may be as large as the device's memory.
            buf = Buffer(arg_names[gm.num_index_operands + i], MemorySpace.HBM,
                         _read_only(a), True)
            hbm_inputs.append(state.register(buf, device, None, ("hbm", i)))
        hbm_outputs: list[Buffer] = []
        for j in range(n_out):
            name = arg_names[gm.num_index_operands + n_in + j]
            if j in out_to_in:
                hbm_outputs.append(hbm_inputs[out_to_in[j]])
            else:
                aval = params["out_avals"][j]
                if (results is not None and mesh.num_devices == 1
                        and results[j].shape == tuple(aval.shape)
                        and results[j].dtype == np.dtype(aval.dtype)):
                    data = results[j]  # the call's own output buffer: filled, simulated in
                    data[...] = memory.fill_value(aval.dtype, fill)
                    buf = Buffer(name, MemorySpace.HBM, data, written=False)
                else:
                    buf = Buffer.filled(name, MemorySpace.HBM, aval.shape, aval.dtype, fill)
                hbm_outputs.append(state.register(buf, device, None, ("hbm", n_in + j)))
        device_hbm_outputs.append(hbm_outputs)

        # Block indices for every grid point, computed in one compiled call per operand.
        templates: list[Operand] = []
        for k, (var, bm) in enumerate(zip(block_vars, gm.block_mappings)):
            is_output = k >= n_in
            hbm = hbm_outputs[k - n_in] if is_output else hbm_inputs[k]
            op = _operand(arg_names[gm.num_index_operands + k], gm.num_index_operands + k,
                          is_output, bm, hbm, var)
            if op.kernel_space != MemorySpace.HBM or not bm.has_trivial_window():
                # An HBM operand with a window (vmap adds a squeezed batch dim) is seen by
                # the kernel as that window of the array, moved at every grid step.
                op.block_indices = _block_indices(bm, points, scalars)
            templates.append(op)

        shared_scratch: dict[int, Buffer] = {}
        for core_id, my_steps in enumerate(core_steps):
            my_points = points[my_steps]
            ctx = CoreContext(state, grid, program_axes, device_id=device, core_id=core_id,
                              num_devices=mesh.num_devices)
            if core_axes:
                ctx.core_coords = dict(zip(core_axes, (int(c) for c in points[core_id])))
            contexts.append(ctx)
            # Each core has its own SMEM copy of the scalar prefetch, its own VMEM blocks
            # and scratch; VMEM_SHARED scratch is one buffer for all cores of a device.
            kernel_args: list[Any] = [
                RefView(state.register(
                    Buffer(arg_names[i], MemorySpace.SMEM, np.array(v), True, owner=ctx.actor),
                    device, core_id, ("smem", i)))
                for i, v in enumerate(scalars)
            ]
            core_operands = []
            for k, template in enumerate(templates):
                op = dataclasses.replace(template)
                if op.block_indices is not None:
                    op.block_indices = op.block_indices[my_steps]
                if op.kernel_space == MemorySpace.HBM:
                    # The whole array, or (under vmap) its window, which _core_body moves
                    # at every grid step: HBM is shared by the cores, never copied to VMEM.
                    kernel_args.append(RefView(op.hbm))
                else:
                    ref_shape = tuple(sz for sz, sq in zip(op.block_sizes, op.squeezed)
                                      if not sq)
                    op.vmem = state.register(
                        Buffer.filled(op.name, op.kernel_space, ref_shape, op.hbm.data.dtype,
                                      fill, owner=ctx.actor),
                        device, core_id, ("block", k))
                    kernel_args.append(RefView(op.vmem))
                core_operands.append(op)
            for position, (var, name) in enumerate(
                    zip(scratch_vars, arg_names[gm.num_index_operands + n_in + n_out:])):
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
            if len(my_points):
                actors.append(Actor(ctx.actor, _core_body(ctx, jaxpr, kernel_args,
                                                          core_operands, my_points)))
    ctx = contexts[0]
    if state.races is not None:
        state.races.declare(actor.name for actor in actors)
    state.scheduler = Scheduler(seed=config.seed)
    try:
        state.scheduler.run(actors)
    except Deadlock as deadlock:
        state.add(state.checkers.deadlocked(state, deadlock, ctx))
        state.deadlocked = True
    # After a deadlock the kernel never finished: leaks and unwritten outputs would be
    # consequences of the hang, not defects of their own.
    _finish_dmas(ctx, report=not state.deadlocked)
    if not state.deadlocked:
        state.checkers.call_ended(state, ctx)
    state.save_carried()
    outputs, written = [], []
    for hbm_outputs in device_hbm_outputs:
        device_written: list[np.ndarray | None] = []
        for j, buf in enumerate(hbm_outputs):
            if j in out_to_in:
                device_written.append(None)
                continue
            device_written.append(buf.shadow)
            if not buf.fully_written and not state.deadlocked:
                state.checkers.output_unwritten(state, buf)
        # The call's buffers die with it: hand their arrays over rather than copy them.
        outputs.append([buf.data for buf in hbm_outputs])
        written.append(device_written)
    return outputs, state, written

