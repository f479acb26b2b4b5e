"""The rules of the semaphore primitives: signal (local or remote), wait, read, and the
barrier semaphore; the semaphores themselves are dma/engine.py's cells.
"""

from __future__ import annotations

import numpy as np

from pallas_check.jaxbridge import params as eqn_params
from pallas_check.jaxbridge.primitives import get_barrier_semaphore_p, semaphore_read_p, semaphore_signal_p, semaphore_wait_p
from pallas_check.jaxbridge.types import JaxprEqn
from pallas_check.engine.dma.devices import _with_core, on_device, on_serial_chip, target_device
from pallas_check.engine.dma.engine import as_view, sem_add, sem_name, sem_value, semaphore_cell
from pallas_check.engine.jaxpr.program import current_frames
from pallas_check.engine.seam import RunningCore
from pallas_check.engine.jaxpr.registry import RuleGen, rule
from pallas_check.engine.rules import sparsecore
from pallas_check.engine.dma.counts import is_regular, read_dma_semaphore
from pallas_check.engine.rules.dma import _account_wait, _wait_ready
from pallas_check.engine.runtime.scheduler import Wait


@rule(semaphore_signal_p)
def _semaphore_signal(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> object:
    sem, transforms, inc, device_id, core_index = eqn_params.args_tree(eqn).unflatten(invals)
    if device_id is not None and ctx.call.core_mesh is not None:
        device_id = sparsecore.signal_device_id(ctx, device_id, sem)
    target = target_device(ctx, device_id, eqn_params.device_id_type(eqn))
    if core_index is not None:
        target = _with_core(ctx, target, core_index)
    serial_target = on_serial_chip(ctx, target, "signal")
    if serial_target is None:
        return []  # to a core the chip does not have: it never arrives
    view = on_device(ctx, as_view(sem).with_transforms(tuple(transforms or ())),
                     serial_target)
    cell = semaphore_cell(ctx, view)
    sem_add(cell, int(np.asarray(inc)))
    ctx.call.sync.last_signal[(cell[0].id, cell[1])] = current_frames(ctx)
    ctx.call.sync.last_signaller[(cell[0].id, cell[1])] = ctx.actor
    ctx.call.on_signal(ctx, cell)
    return []


@rule(semaphore_wait_p, generator=True)
def _semaphore_wait(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> RuleGen:
    sem, transforms, value, decrement = eqn_params.args_tree(eqn).unflatten(invals)
    view = as_view(sem).with_transforms(tuple(transforms or ()))
    cell = semaphore_cell(ctx, view)
    wanted = int(np.asarray(value))
    # DMAs may signal a regular semaphore (one count each): in `on_wait` mode the wait
    # lands those it needs, as a DMA wait does, and what it takes is theirs.
    if not _wait_ready(ctx, cell, wanted):
        yield Wait(lambda: _wait_ready(ctx, cell, wanted), "semaphore wait",
                   current_frames(ctx), semaphore=sem_name(cell), wanted=wanted,
                   current=lambda: sem_value(cell), cell=cell)
    if decrement is None or bool(np.asarray(decrement)):
        sem_add(cell, -wanted)
        _account_wait(ctx.call.sync, cell, wanted, current_frames(ctx))
    ctx.call.on_semaphore_wait(ctx, cell)
    return []


@rule(semaphore_read_p)
def _semaphore_read(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> object:
    sem, transforms = eqn_params.args_tree(eqn).unflatten(invals)
    view = as_view(sem).with_transforms(tuple(transforms or ()))
    value = sem_value(semaphore_cell(ctx, view))
    if not is_regular(eqn.invars[0].aval):  # a DMA semaphore: kept in bytes
        value = read_dma_semaphore(value, ctx.call.tpu)
    return np.int32(value)


@rule(get_barrier_semaphore_p)
def _get_barrier_semaphore(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> object:
    return ctx.call.barrier_semaphore(ctx)
