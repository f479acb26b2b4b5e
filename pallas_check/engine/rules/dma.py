"""The rules of the DMA primitives (`dma_start`, `dma_wait`, specialized once per equation
where its layout allows); the DMAs and semaphores they drive are engine/dma/engine.py's.

DMA semaphores count bytes, as on a TPU, and a DMA is two events: it reads its source,
which signals the send semaphore (`wait_send`: the source may be reused), then it writes
its destination, which signals the receive semaphore (`wait_recv`: the data has landed).
A wait takes the bytes of the waited ref off its semaphore. When the events happen is the
DMA mode's (engine/dma/policy.py): the rules tell the call's policy that a DMA started
(`started`) and that a wait finds its semaphore short (`land_for`). DMAs never waited
complete at kernel end.
A DMA that signals a regular semaphore adds what the generation's chip adds (its 32-byte
count on a v5e, as measured; one per DMA on v6e+: engine/dma/counts.py), and
`pl.semaphore_wait` on it lands DMAs as a DMA wait does (`signal_count`). A DMA that moves
no bytes (a traced size of 0) signals nothing on either type.
"""

from __future__ import annotations

import math
from typing import Generator, Sequence

from jax.tree_util import PyTreeDef
import numpy as np

from pallas_check.jaxbridge import params as eqn_params
from pallas_check.engine.dma.counts import is_regular, regular_signal
from pallas_check.jaxbridge.primitives import dma_start_p, dma_wait_p
from pallas_check.jaxbridge.types import Indices, JaxprEqn, TransformedRef
from pallas_check.engine.dma import indirect
from pallas_check.engine.dma.devices import on_device, on_serial_chip, target_device
from pallas_check.engine.dma.engine import (Dma, SemCell, SyncState, as_view, cell_of, sem_add,
                                            sem_name, sem_value)
from pallas_check.engine.jaxpr.halts import KernelError
from pallas_check.engine.jaxpr.mosaic_limits import indirect_indexer
from pallas_check.engine.jaxpr.program import current_frames
from pallas_check.engine.jaxpr.registry import RuleFn, RuleGen, rule, specializer
from pallas_check.engine.memory.buffer import MemorySpace, RefView, memory_space_name
from pallas_check.engine.memory.region import Region, resolve, view_shape
from pallas_check.engine.rules import index_plan
from pallas_check.engine.rules.dma_bounds import halt_unbounded, tile_padded, unbounded
from pallas_check.engine.rules.access import access_read
from pallas_check.engine.runtime import caches, progress
from pallas_check.engine.runtime.scheduler import Wait
from pallas_check.engine.seam import RunningCore
from pallas_check.engine.verdicts import Frames
from pallas_check.findings.sourceinfo import user_frames


# -- rules ----------------------------------------------------------------------------------


@caches.by_identity
def _dma_layout(eqn: JaxprEqn
                ) -> tuple[tuple[int, int, PyTreeDef, index_plan.IndexPlan | None], ...]:
    """Per DMA argument (src, dst, dst_sem, src_sem, device_id): where its leaves sit in
    the equation's flat operands, its own pytree structure, and its index plan (the
    version-aware reading is the bridge's `dma_operands`)."""
    return tuple((a.start, a.stop, a.tree, index_plan.plan_for(a.tree))
                 for a in eqn_params.dma_operands(eqn))


def _arg_region(ctx: RunningCore, layout: index_plan.ArgLayout, invals: Sequence[object],
                target: tuple[int, int | None] | None = None) -> Region:
    """The region of one ref argument of a DMA, on the `target` device and core if given
    (else where the ref is). A local one is resolved once per call for the same ref and
    index values (a double buffer's slots and semaphores recur at every step; a paged
    kernel's pages do not, and a miss costs only its key)."""
    leaves = invals[layout[0]:layout[1]]
    if target is None:
        return ctx.call.accesses.get_or_make(layout, leaves,
                                             lambda: _arg_region_made(ctx, layout, leaves))
    return _arg_region_made(ctx, layout, leaves, target)


def _arg_region_made(ctx: RunningCore, layout: index_plan.ArgLayout, leaves: Sequence[object],
                     target: tuple[int, int | None] | None = None) -> Region:
    """Through the argument's index plan, or the general way (JAX's indexer objects)
    when the plan does not cover it."""
    _, _, tree, plan = layout
    if plan is not None and plan.ref is not None:
        ref = leaves[plan.ref]
        if target is not None and ref.__class__ is RefView:
            ref = on_device(ctx, ref, target)
        region = plan.region(leaves, ref)
        if region is not None:
            return region
    view = as_view(tree.unflatten(leaves))
    if target is not None:
        view = on_device(ctx, view, target)
    return resolve(view)


@caches.by_identity
def signal_count(eqn: JaxprEqn) -> int:
    """What a DMA start adds to its semaphores, by their type in the kernel's jaxpr: its
    bytes (-1) on DMA semaphores; on a regular semaphore (`pltpu.SemaphoreType.REGULAR`;
    Mosaic lowers a barrier semaphore to the same type) 1, meaning the generation's count
    (`engine/dma/counts.py` `regular_signal`: the DMA's 32-byte count on a v5e, as
    measured; one per DMA on v6e+ per JAX's tests, unverified). Every generation we
    simulate takes it: libtpu 0.0.42 compiles such a DMA for
    v5e, v5p, v6e and v7x alike and rejects only older chips ("Regular semaphores in
    EnqueueDMA are not supported on this target": v4). What Mosaic's verifier rejects on
    every chip is the kernel's error, raised here at the DMA's line."""
    src_at, dst_at, dst_sem_at, src_sem_at, _ = _dma_layout(eqn)
    avals = [v.aval for v in eqn.invars]

    def aval(at: tuple[int, int, PyTreeDef, object]) -> object:
        return at[2].unflatten(avals[at[0]:at[1]])

    regular = is_regular(aval(dst_sem_at))
    if src_sem_at[1] > src_sem_at[0] and is_regular(aval(src_sem_at)) != regular:
        raise KernelError("DMA source and target semaphore must have the same type (Mosaic):"
                          " both DMA semaphores or both regular ones",
                          user_frames(eqn.source_info))
    if not regular:
        return -1
    for at in (src_at, dst_at):
        if memory_space_name(getattr(aval(at), "memory_space", None)) == MemorySpace.SMEM:
            raise KernelError("a DMA to or from SMEM cannot signal a regular semaphore"
                              " (Mosaic: \"Non-DMA semaphores are not supported for DMAs"
                              " involving SMEM\"): use a pltpu.SemaphoreType.DMA",
                              user_frames(eqn.source_info))
    return 1


@rule(dma_start_p, generator=True)
def _dma_start(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> RuleGen:
    side = _indirect_side(eqn)
    if side is not None:  # a SparseCore gather or scatter (engine/dma/indirect.py)
        if _indirect_start(ctx, eqn, invals, side):
            yield None
        return []
    src_at, dst_at, dst_sem_at, src_sem_at, device_at = _dma_layout(eqn)
    device_id = device_at[2].unflatten(invals[device_at[0]:device_at[1]])
    target = (None if device_id is None  # the sender's own device and core
              else on_serial_chip(ctx, target_device(ctx, device_id,
                                                     eqn_params.device_id_type(eqn)), "DMA"))
    if device_id is not None and target is None:
        return []  # to a core the chip does not have: nothing moves, nothing is signalled
    src_region = tile_padded(ctx, _arg_region(ctx, src_at, invals))
    dst_region = tile_padded(ctx, _arg_region(ctx, dst_at, invals, target))
    frames = current_frames(ctx)
    if src_region.zero_stride or dst_region.zero_stride:
        raise KernelError("a DMA slice with a stride of 0 (pl.ds(start, n, 0)) is not a"
                          " copy a DMA engine makes: Pallas TPU takes stride-0 slices only"
                          " in loads", frames)
    if unbounded(src_region) or unbounded(dst_region):
        halt_unbounded(ctx, src_region, dst_region, frames)
    src_shape, _ = _view_layout(src_region)
    dst_shape, dst_dtype = _view_layout(dst_region)
    if math.prod(src_shape) != math.prod(dst_shape):
        raise KernelError(
            f"DMA shapes differ: {src_region.buffer.name}{list(src_shape)} ->"
            f" {dst_region.buffer.name}{list(dst_shape)}", frames)
    src_sem_region = (_arg_region(ctx, src_sem_at, invals)
                      if src_sem_at[1] > src_sem_at[0] else None)
    if _begin_dma(ctx, src_region, dst_region,
                  (cell_of(ctx, _arg_region(ctx, dst_sem_at, invals, target)),
                   cell_of(ctx, src_sem_region) if src_sem_region is not None else None),
                  (math.prod(dst_shape) * dst_dtype.itemsize, signal_count(eqn)), frames):
        yield None  # a scheduling point: another actor may run between start and what follows
    return []


def _begin_dma(ctx: RunningCore, src: Region, dst: Region,
               sems: tuple[SemCell, SemCell | None], moves: tuple[int, int],
               frames: Frames, atomic_add: bool = False) -> bool:
    """Start a DMA whose arguments are resolved; whether the start is a scheduling point
    (not when one actor runs alone: the watchdog is told it is alive instead). `sems`: its
    receive and send semaphores; `moves`: its bytes and what it adds to its semaphores (-1:
    its bytes; `signal_count`); `atomic_add`: a SparseCore scatter-add."""
    call = ctx.call
    (dst_sem, src_sem), (nbytes, signal) = sems, moves
    if src.oob or dst.oob:  # (a planned DMA's regions come here unconverted)
        src, dst = tile_padded(ctx, src), tile_padded(ctx, dst)
    if src.oob:
        call.out_of_bounds(ctx, src, "DMA source", None)
    if dst.oob:
        call.out_of_bounds(ctx, dst, "DMA destination", None)
    # A DMA that moves no bytes signals nothing, on any semaphore type (measured on a
    # v5e: engine/dma/counts.py): a DMA semaphore gets its 0 bytes, a regular one no count
    # (JAX's interpreter signals a DMA's bytes on every semaphore). A non-empty DMA adds
    # to a regular semaphore what the generation's chip adds (`regular_signal`).
    dma = Dma(call.sync.next_id(), src, dst, dst_sem, src_sem, nbytes, ctx.actor, frames,
              ctx.grid_point, nbytes if signal < 0 else regular_signal(nbytes, call.tpu),
              atomic_add=atomic_add)
    if call.address_probe is not None and dma.id in call.address_probe:
        call.address_probe[dma.id] = (src.index_range(), dst.index_range())
    call.sync.start(dma)
    call.on_dma_start(ctx, dma)
    call.dma_policy.started(ctx, dma)
    scheduler = call.scheduler
    if scheduler is not None and scheduler.alone:
        progress.beat()
        return False
    return True


@specializer(dma_start_p)
def _planned_dma_start(eqn: JaxprEqn) -> RuleFn | None:
    """A local DMA (no device id) whose source and destination are in the planned spelling
    (ints and static-size slices on a ref without transforms; see index_plan), made for
    this equation: the shapes, bytes and source line are worked out once, the source's
    region straight from its plan, and the destination and semaphores looked up together.
    Any other value (a ref with transforms, an index array) takes `_dma_start`."""
    static = _planned_dma(eqn)
    if static is None:
        return None
    src_at, rest_at, nbytes, _, frames = static
    src_lo, src_hi, _, src_plan = src_at
    assert src_plan is not None and src_plan.ref is not None  # (planned: `_planned_dma`)
    src_region, src_ref = src_plan.region, src_plan.ref  # (typed: no checks per DMA)
    moves = (nbytes, signal_count(eqn))

    def planned_dma_start(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> RuleGen:
        leaves = invals[src_lo:src_hi]
        src = src_region(leaves, leaves[src_ref])
        if src is None or src.zero_stride:
            return (yield from _dma_start(ctx, eqn, invals))
        resolved = ctx.call.accesses.get_or_make(
            eqn, invals[rest_at:], lambda: _dst_and_semaphores(ctx, eqn, invals))
        if resolved is None or resolved[0].zero_stride:
            return (yield from _dma_start(ctx, eqn, invals))
        dst, sems = resolved
        if _begin_dma(ctx, src, dst, sems, moves, frames):
            yield None
        return []

    return planned_dma_start


def _planned_dma(eqn: JaxprEqn) -> tuple[index_plan.ArgLayout, int, int, int, Frames] | None:
    """What a local, planned DMA start or wait knows before it runs: the source's layout,
    where the operands after the source begin, the bytes a start signals and a wait
    takes (static, whatever the indices) and its source frames (None when not all of
    that is static: the general rules then run)."""
    src_at, dst_at, _, _, device_at = _dma_layout(eqn)
    frames = user_frames(eqn.source_info)
    if device_at[1] > device_at[0] or not frames or _indirect_side(eqn) is not None:
        return None
    shapes, itemsizes = [], []
    for lo, _, _, plan in (src_at, dst_at):
        if plan is None or plan.ref is None:
            return None
        ref = eqn.invars[lo + plan.ref].aval
        shape = getattr(ref, "shape", None)
        if shape is None:
            return None  # no ref's aval: the general rules explain it
        for step in plan.steps:  # each indexer takes the dims the one before left
            if len(step) != len(shape):
                return None  # ranks the general rule explains as an error
            shape = [size for _, _, size, _ in step if size is not None]
        shapes.append(shape)
        itemsizes.append(np.dtype(getattr(ref, "dtype")).itemsize)
    if math.prod(shapes[0]) != math.prod(shapes[1]):
        return None  # sizes the general rule explains as an error
    # A start signals the destination's bytes; a wait takes its descriptor source's.
    return (src_at, src_at[1], math.prod(shapes[1]) * itemsizes[1],
            math.prod(shapes[0]) * itemsizes[0], frames)


def _dst_and_semaphores(ctx: RunningCore, eqn: JaxprEqn, invals: Sequence[object]
                        ) -> tuple[Region, tuple[SemCell, SemCell | None]] | None:
    """A planned DMA's destination region and (receive, send) semaphore cells (cached per
    call by their operands), or None when the destination is not in the planned spelling."""
    _, dst_at, dst_sem_at, src_sem_at, _ = _dma_layout(eqn)
    leaves = invals[dst_at[0]:dst_at[1]]
    plan = dst_at[3]
    assert plan is not None and plan.ref is not None  # (a planned DMA's: `_planned_dma`)
    dst = plan.region(leaves, leaves[plan.ref])
    if dst is None:
        return None
    src_sem = (cell_of(ctx, _arg_region_made(ctx, src_sem_at, invals[src_sem_at[0]:src_sem_at[1]]))
               if src_sem_at[1] > src_sem_at[0] else None)
    return (dst, (cell_of(ctx, _arg_region_made(ctx, dst_sem_at,
                                                invals[dst_sem_at[0]:dst_sem_at[1]])),
                  src_sem))


def _view_layout(region: Region) -> tuple[tuple[int, ...], np.dtype]:
    """The shape a DMA of `region` moves and its element type, the view's own (post
    transforms such as reshape and bitcast change both)."""
    if not region.post:
        return region.out_shape, region.buffer.data.dtype
    return view_shape(region), region.view_dtype()


def _wait_descriptor(ctx: RunningCore, layout: tuple[index_plan.ArgLayout, ...],
                     invals: Sequence[object], regular: bool) -> tuple[int, SemCell]:
    """What a DMA wait takes off (its descriptor's source bytes; on a regular semaphore
    the generation's count for them) and its semaphore cell."""
    shape, dtype = _view_layout(_arg_region(ctx, layout[0], invals))
    nbytes = math.prod(shape) * dtype.itemsize
    return (regular_signal(nbytes, ctx.call.tpu) if regular else nbytes,
            cell_of(ctx, _arg_region(ctx, layout[2], invals)))


@rule(dma_wait_p, generator=True)
def _dma_wait(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> RuleGen:
    # The bytes waited for are the size of the descriptor's source: a static shape,
    # whatever the slice starts, so the source's indices (a different page at every step
    # in a paged kernel) are left out of the cache key; unless a slice has a traced size
    # (`pl.ds(0, n)`): then the bytes are evaluated from the leaves at each wait.
    layout = _dma_layout(eqn)
    side = _indirect_side(eqn)
    if side is not None:  # a SparseCore gather or scatter
        yield from _indirect_wait(ctx, layout, invals, side)
        return []
    (src_start, src_end, src_tree, _), _, (sem_start, sem_end, _, _), *_ = layout
    if index_plan.has_dynamic_size(src_tree):
        key = [*invals[src_start:src_end], *invals[sem_start:sem_end]]
    else:
        key = [invals[src_start], *invals[sem_start:sem_end]]
    nbytes, cell = ctx.call.accesses.get_or_make(
        eqn, key, lambda: _wait_descriptor(ctx, layout, invals, signal_count(eqn) > 0))
    frames = current_frames(ctx)
    if not _wait_ready(ctx, cell, nbytes):
        yield _wait_request(ctx, cell, nbytes, frames)
    _end_wait(ctx, cell, nbytes, frames)
    return []


def _wait_ready(ctx: RunningCore, cell: SemCell, nbytes: int) -> bool:
    """Whether a DMA wait can go on now (the DMA mode landing what it lets land at a wait
    first: `on_wait` mode)."""
    if sem_value(cell) >= nbytes:
        return True
    call = ctx.call
    call.dma_policy.land_for(ctx, call.sync, cell, nbytes)
    return sem_value(cell) >= nbytes


def _wait_request(ctx: RunningCore, cell: SemCell, nbytes: int, frames: Frames) -> Wait:
    """What the scheduler holds a DMA wait on (a DMA started later is delivered on demand
    too, in `on_wait` mode)."""
    return Wait(lambda: _wait_ready(ctx, cell, nbytes), "DMA wait", frames,
                semaphore=sem_name(cell), wanted=nbytes, current=lambda: sem_value(cell),
                cell=cell)


def _end_wait(ctx: RunningCore, cell: SemCell, nbytes: int, frames: Frames) -> None:
    sem_add(cell, -nbytes)
    _account_wait(ctx.call.sync, cell, nbytes, frames)
    ctx.call.on_dma_wait(ctx, cell, frames)


@specializer(dma_wait_p)
def _planned_dma_wait(eqn: JaxprEqn) -> RuleFn | None:
    """A local, planned DMA's wait (see `_planned_dma_start`): its bytes and source line
    known before it runs; only its semaphore is looked up."""
    static = _planned_dma(eqn)
    if static is None:
        return None
    _, _, sem_at, _, _ = _dma_layout(eqn)
    sem_lo, sem_hi = sem_at[0], sem_at[1]
    _, _, _, descriptor_bytes, frames = static
    regular = signal_count(eqn) > 0

    def planned_dma_wait(ctx: RunningCore, eqn: JaxprEqn, invals: list[object]) -> RuleGen:
        cell = ctx.call.accesses.get_or_make(
            eqn, invals[sem_lo:sem_hi],
            lambda: cell_of(ctx, _arg_region_made(ctx, sem_at, invals[sem_lo:sem_hi])))
        nbytes = (regular_signal(descriptor_bytes, ctx.call.tpu) if regular
                  else descriptor_bytes)
        if not _wait_ready(ctx, cell, nbytes):
            yield _wait_request(ctx, cell, nbytes, frames)
        _end_wait(ctx, cell, nbytes, frames)
        return []

    return planned_dma_wait


# -- indirect DMAs (SparseCore gathers and scatters: engine/dma/indirect.py) --------------


@caches.by_identity
def _indirect_side(eqn: JaxprEqn) -> int | None:
    """Which argument of a DMA start or wait an index vector indexes (0: the source, a
    gather; 1: the destination, a scatter), None for a plain DMA: decided once per
    equation from its vars."""
    src, dst, *_ = eqn_params.dma_arguments(eqn, eqn.invars)
    return indirect.indexed_side(src, dst)


def _indirect_start(ctx: RunningCore, eqn: JaxprEqn, invals: list[object], side: int) -> bool:
    """Start a gather (`side` 0) or scatter (1): the index vector read now (bounds, races
    and the written-shadow of the index ref), each active index checked against the
    indexed view, the rows in bounds moved by one `Dma` the DMA mode drives."""
    src_at, dst_at, dst_sem_at, _, device_at = _dma_layout(eqn)
    frames = current_frames(ctx)
    if device_at[1] > device_at[0]:
        raise KernelError("a gather or scatter DMA to or from a remote device is not"
                          " supported (Mosaic)", frames)
    indexed_at, plain_at = (src_at, dst_at) if side == 0 else (dst_at, src_at)
    plain = _arg_region(ctx, plain_at, invals)
    view = as_view(indexed_at[2].unflatten(invals[indexed_at[0]:indexed_at[1]]))
    found = indirect_indexer(view.transforms)
    assert found is not None  # the equation's vars have it there (`_indirect_side`)
    indexer, at = found
    # The indexed view, kept for the call (by its ref and indices, as `_arg_region` does):
    # through a bitcast or reshape its element map is made once, not at every DMA.
    base = ctx.call.accesses.get_or_make(
        indexed_at, invals[indexed_at[0]:indexed_at[1]],
        lambda: resolve(indirect.split_view(view, indexer, at)))
    vector = _index_vector(ctx, indexer.indices[0], frames)
    # Rows of the views (a bitcast or reshape before the indexer, or on the plain side,
    # is the view Mosaic gathers or scatters through).
    base_shape, plain_shape = view_shape(base), view_shape(plain)
    shape = (len(vector.values), *base_shape[1:])
    if shape != plain_shape:
        src_shape, dst_shape = (shape, plain_shape) if side == 0 else (plain_shape, shape)
        raise KernelError(f"DMA shapes differ: {list(src_shape)} -> {list(dst_shape)} (a"
                          " gather or scatter moves one row per index)", frames)
    operation = "DMA source" if side == 0 else "DMA destination"
    if plain.oob:
        ctx.call.out_of_bounds(ctx, plain, ("DMA destination", "DMA source")[side], None)
    size = base_shape[0]
    bad = vector.active & ((vector.values < 0) | (vector.values >= size))
    for element in np.nonzero(bad)[0]:
        region = indirect.bad_row_region(base, int(vector.values[element]), int(element),
                                         vector)
        ctx.call.out_of_bounds(ctx, region, operation, None)
    positions, rows = indirect.active_rows(vector, size)
    add = eqn_params.adds(eqn)
    indexed = indirect.rows_region(base, rows, add and side == 1)
    others = indirect.rows_region(plain, positions, add and side == 0)
    src, dst = (indexed, others) if side == 0 else (others, indexed)
    nbytes = math.prod(dst.out_shape) * dst.view_dtype().itemsize
    cell = cell_of(ctx, _arg_region(ctx, dst_sem_at, invals))
    # Rows regions answer what a Dma asks of its sides as a Region does (duck-typed)
    return _begin_dma(ctx, src, dst, (cell, None),  # type: ignore[arg-type]
                      (nbytes, signal_count(eqn)), frames, add)


def _index_vector(ctx: RunningCore, index: object, frames: Frames) -> indirect.IndexVector:
    """An indirect DMA's index vector, read at its start: a ref's through the one read
    path (bounds, races, the written-shadow); a value as it is; `plsc.Indices` filtered."""
    ignored = None
    if isinstance(index, Indices):
        ignored = index.ignored_value
        index = index.values
    if isinstance(index, (RefView, TransformedRef)):
        view = as_view(index)
        region = resolve(view)
        values = np.asarray(access_read(ctx, None, region=region))
        name = indirect.vector_name(view, region)
    else:
        values, name = np.asarray(index), "(a value)"
    if values.ndim != 1:
        raise KernelError(f"the index vector of a gather or scatter DMA must be 1-D, got"
                          f" shape {list(values.shape)} (Mosaic)", frames)
    values = values.astype(np.int64)
    active = (values != ignored) if ignored is not None else np.ones(values.shape, bool)
    return indirect.IndexVector(values, active, name)


def _indirect_wait(ctx: RunningCore, layout: tuple[index_plan.ArgLayout, ...],
                   invals: list[object], side: int) -> Generator[Wait, None, None]:
    """The wait of a gather or scatter (`tpu.wait_indirect_dma(sem, src, dst)`: the whole
    refs, no offsets, no filter): it waits for one indirect DMA on its semaphore, the
    oldest not yet waited, and takes what that DMA signals (the bytes it moved: a filtered
    DMA's ignored rows are not counted; one that moved nothing is waited at once); with
    none in flight, the bytes of its plain side (every row), which only another DMA's
    signal can bring."""
    cell = cell_of(ctx, _arg_region(ctx, layout[2], invals))
    nbytes = None
    queue = ctx.call.sync._unwaited.get((cell[0].id, cell[1]), ())
    for dma in queue:
        if isinstance(dma.src, (indirect.RowsRegion, indirect.ViewRowsRegion)):
            nbytes = dma.signal - dma.waited_bytes
            if nbytes <= 0:  # it moved nothing (every index ignored): waited now
                queue.remove(dma)
                nbytes = 0
            break
    if nbytes is None:
        shape, dtype = _view_layout(_arg_region(ctx, layout[1 - side], invals))
        nbytes = math.prod(shape) * dtype.itemsize
    frames = current_frames(ctx)
    if not _wait_ready(ctx, cell, nbytes):
        yield _wait_request(ctx, cell, nbytes, frames)
    _end_wait(ctx, cell, nbytes, frames)


def _account_wait(sync: SyncState, cell: SemCell, nbytes: int, frames: Frames = ()) -> None:
    """Attribute waited bytes to the DMAs on this semaphore, oldest first (`frames`: the
    wait's line, kept by each DMA it finishes)."""
    queue = sync._unwaited.get((cell[0].id, cell[1]))
    while queue and nbytes > 0:
        dma = queue[0]
        if dma.waited_bytes < dma.signal:
            take = min(dma.signal - dma.waited_bytes, nbytes)
            dma.waited_bytes += take
            nbytes -= take
        if dma.waited_bytes >= dma.signal:
            dma.waited_at = dma.waited_at or frames
            queue.popleft()  # fully waited: only ever the oldest ones
            sync.settled(dma)


