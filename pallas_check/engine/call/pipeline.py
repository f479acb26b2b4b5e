"""The BlockSpec pipeline of one core: the grid walk, block copies in and out, HBM windows,
and DMAs still in flight at the end."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Generator, Sequence

import numpy as np

from pallas_check.jaxbridge.jaxprs import source_text
from pallas_check.jaxbridge.types import Jaxpr, NDIndexer, Slice
from pallas_check.engine.call.describe import Operand
from pallas_check.engine.call.revisit import Perturbation, RevisitRecord
from pallas_check.engine.call.state import CallState, CoreContext
from pallas_check.engine.dma.engine import DmaCore, Transfer
from pallas_check.engine.jaxpr.program import runner_for
from pallas_check.engine.memory.buffer import Buffer, MemorySpace, RefView
from pallas_check.engine.runtime.scheduler import Wait
from pallas_check.engine.rules import mxu
from pallas_check.findings.finding import IndexRange, SourceFrame
from pallas_check.findings.sourceinfo import code_line, parse_src_info


def _core_body(ctx: CoreContext, jaxpr: Jaxpr, kernel_args: list[RefView],
               operands: list[Operand], points: np.ndarray
               ) -> Generator[Wait | None, None, None]:
    """The actor of one core: the grid walk with the block pipeline around each step."""
    blocked = [op for op in operands if not op.whole_array]
    windowed = [op for op in operands if op.whole_array and op.block_indices is not None]
    pipe = Pipeline(ctx, blocked, points)
    outputs = pipe.outputs
    # An output whose block is an aliased input's (simulate.py `_aliased_whole_block`)
    # starts with what the input brought in, not as fresh memory.
    inputs_blocks = {id(op.vmem) for op in blocked if not op.is_output}
    fresh = [plan for plan in outputs if id(plan.op.vmem) not in inputs_blocks]
    num_steps = len(points)
    walked = ctx.call.steps  # a progress line reads it (engine/runtime/progress.py): one add a step
    body = runner_for(jaxpr, ctx.config.skip_floats)  # the kernel's program, found once
    for step in range(num_steps):
        point = pipe.grid_points[step]
        ctx.grid_point = point
        ctx.eqn = None
        yield None  # a scheduling point: another core may run a step here
        ctx.call.on_grid_step(ctx, point)  # timeline: a grid step's slice begins
        for op in windowed:
            kernel_args[op.position] = _hbm_window(op, op.block_indices[step])  # type: ignore[index]
        yield from pipe.inputs_ready(step)
        for plan in fresh:
            if plan.changed[step]:
                if plan.revisit_of and step in plan.revisit_of:
                    yield from pipe.revisit(plan, step)
                    continue
                vmem = _fresh_block(ctx, plan, step)
                if ctx.call.fresh_revisits:
                    ctx.call.fresh_revisits.pop(vmem.id, None)
        perturb = ctx.call.perturb  # a perturbed re-run (revisit.py); None otherwise
        saved = (perturb.apply([plan.op.vmem for plan in pipe.inputs
                                if plan.op.kernel_space != MemorySpace.SMEM
                                and plan.op.vmem is not None])
                 if perturb is not None and (ctx.device_id, point) in perturb.points
                 else None)
        yield from body(ctx, (), kernel_args)
        ctx.eqn = None
        if perturb is not None:
            if saved:
                Perturbation.restore(saved)
            if (ctx.device_id, point) in perturb.capture:
                perturb.fingerprint((ctx.device_id, point), ctx.private_buffers)
        yield from pipe.outputs_done(step)
        walked.done += 1
    yield from pipe.drain()
    pipe.record_revisits()
    mxu.kernel_ended(ctx)  # what it leaves in its MXUs
    ctx.call.on_core_done(ctx)  # it accesses nothing more; the last grid step's slice ends



def _fresh_block(ctx: CoreContext, plan: _Plan, step: int) -> Buffer:
    """An output block's VMEM at a visit that does not read it back: fresh memory (the
    fill, never written), after its block index is checked against the array."""
    assert ctx.grid_point is not None  # (inside the grid walk)
    plan.check_bounds(ctx, step, ctx.grid_point)
    vmem = plan.op.vmem
    assert vmem is not None
    if ctx.call.ever_written is not None:  # the note of memory never touched
        ctx.call.ever_written.before_reset(vmem)
    vmem.writable()[...] = ctx.fill(vmem.data.dtype)
    vmem.mark_written(Ellipsis, False)
    return vmem

class _Plan:
    """What the pipeline knows of one blocked operand on one core, computed once: the
    block of every step, where it changes, which blocks are out of bounds, the depth."""

    def __init__(self, op: Operand) -> None:
        indices = op.block_indices
        assert indices is not None
        self.op = op
        self.blocks = [tuple(b) for b in indices.tolist()]
        changed = np.ones(len(indices), bool)
        if len(indices) > 1 and indices.shape[1]:
            changed[1:] = np.any(indices[1:] != indices[:-1], axis=1)
        elif len(indices) > 1:
            changed[1:] = False
        self.changed: list[bool] = changed.tolist()
        self.depth = _depth(op)
        self.copies = 0  # started so far (copy k uses VMEM buffer k % depth)
        self._frames: tuple[SourceFrame, ...] | None = None
        self._bad = _out_of_bounds_steps(op, indices)
        # Blocks visited in more than one run of steps (an output's write-back of an
        # earlier visit is overwritten by a later one's: what it wrote may be lost).
        self.revisited: set[tuple[int, ...]] = set()
        if op.is_output:
            runs = collections.Counter(self.blocks[i] for i, c in enumerate(self.changed) if c)
            self.revisited = {b for b, n in runs.items() if n > 1}
        # pl.Buffered(1, revisit=pl.RevisitMode.ANY): a revisit reads the block back.
        self.restores = op.is_output and _revisit_any(op)
        self.first_run: dict[tuple[int, ...], tuple[int, int]] = {}  # block -> its steps
        self.revisit_of: dict[int, int] = {}  # a revisit's first step -> the first visit's
        if self.revisited:
            self._runs()

    def _runs(self) -> None:
        """Where each revisited block's first visit runs, and where its revisits start."""
        starts = [i for i, c in enumerate(self.changed) if c]
        for start, stop in zip(starts, starts[1:] + [len(self.blocks)]):
            block = self.blocks[start]
            if block not in self.revisited:
                continue
            if block in self.first_run:
                self.revisit_of[start] = self.first_run[block][0]
            else:
                self.first_run[block] = (start, stop)

    @property
    def frames(self) -> tuple[SourceFrame, ...]:
        if self._frames is None:
            self._frames = _index_map_frames(self.op)
        return self._frames

    def check_bounds(self, ctx: CoreContext, step: int, point: tuple[int, ...],
                     during: tuple[int, ...] | None = None) -> None:
        """Report step `step`'s block if it is outside the array: chosen by the index map
        at grid point `point`, fetched ahead during grid point `during` (None: at its own
        step), so that the finding names the grid point whose index map is wrong."""
        if step in self._bad:
            _check_block_bounds(ctx, self.op, self.blocks[step], point, during)


def _out_of_bounds_steps(op: Operand, indices: np.ndarray) -> set[int]:
    """The steps whose block is (partly) outside the array, all steps at once."""
    if not indices.shape[1] or not len(indices):
        return set()
    ndim = len(op.block_sizes)
    block_sizes = np.array(op.block_sizes)
    blocks = indices[:, :ndim]
    starts = blocks * block_sizes
    bad = (starts < 0) | (starts >= np.array(op.hbm.shape))  # a block starting outside
    element = np.array(op.element, bool)
    if element.any():  # an Element dim: its window, in array coordinates, may reach padding
        sizes = np.broadcast_to(block_sizes, (len(indices), ndim))
        if op.bounded:  # a BoundedSlice dim's size is its slice's, at most the block's
            sizes = sizes.copy()
            sizes[:, np.array(op.bounded)] = indices[:, ndim:]
        low, high = np.array(op.element_bounds()).T
        element_starts = blocks + low
        element_bad = ((element_starts < low) | (element_starts + sizes > high)
                       | (sizes < 0) | (sizes > block_sizes))
        bad = np.where(element, element_bad, bad)
    return set(np.nonzero(bad.any(axis=1))[0].tolist())


# A block's (HBM index, VMEM index, empty, HBM range): where its valid part is in the
# array and in the block buffer, whether it is empty, and its range in the array.
Slices = tuple[tuple[int | slice, ...], tuple[int | slice, ...], bool, IndexRange]


@dataclasses.dataclass(eq=False, slots=True)
class BlockCopy(Transfer):
    """One copy of the BlockSpec pipeline, a DMA of its own that the call's DMA mode
    drives as it drives the kernel's DMAs (engine/dma/policy.py; an actor in `--dma
    random`): a copy-in reads an input block from HBM for grid step `step`; a write-back
    writes the output block of `step` to HBM. `staged` holds what it read (values,
    written-shadow). Its one event (`_move`) is its landing: a copy-in's data reaches
    VMEM when the core waits it (`_land_in_vmem`), after which the core reads it."""

    plan: _Plan
    block: tuple[int, ...]
    step: int
    grid_point: tuple[int, ...]
    writes_back: bool
    # The copy as an actor, `pipeline copy-in of x_ref block (3, 0)` (only when races are
    # checked, a timeline is drawn or DMAs are actors; else "").
    actor_name: str
    slices: Slices  # (HBM index, VMEM index, empty, HBM range) of the block's valid part
    call: CallState  # whose listeners its move is told to (whoever drives it)
    staged: tuple[np.ndarray, bool | np.ndarray] | None = None
    copied: bool = False  # copy-in: HBM was read; write-back: HBM was written

    def complete(self, ctx: DmaCore) -> None:
        _move(self.call, self)

    def events(self, ctx: DmaCore) -> Generator[None, None, None]:
        return _copy_actor(self.call, self)


class Pipeline:
    """A core's BlockSpec pipeline, as a TPU runs it (JAX's pipelining docs): the copy-in
    of step i+1's changed input blocks starts before body i and is waited before body i+1;
    the write-back of step i's output block starts after body i and is waited after body
    i+1 (the last ones at the end); a block whose index does not change is neither fetched
    nor written back; `pipeline_mode=pl.Buffered(n)` sets how many steps ahead (n-1) it
    runs. Each copy takes part in race detection as its own actor, ordered after what
    its core did before starting it and before what the core does after waiting it."""

    def __init__(self, ctx: CoreContext, blocked: list[Operand], points: np.ndarray) -> None:
        self.ctx = ctx
        self.inputs = [_Plan(op) for op in blocked if not op.is_output]
        self.outputs = [_Plan(op) for op in blocked if op.is_output]
        self.points = points
        self.fetching: dict[tuple[int, int], BlockCopy] = {}  # (plan id, step) -> copy-in
        self.writing: list[BlockCopy] = []  # write-backs in flight, oldest first
        # (plan id, block) -> each visit's (grid point, elements it wrote), for revisits
        self.visits: dict[tuple[int, tuple[int, ...]],
                          list[tuple[tuple[int, ...], bool | np.ndarray]]] = {}
        self.grid_points = [tuple(p) for p in points.tolist()]
        self.policy = ctx.call.dma_policy  # when copies move: the call's DMA mode
        self.named = (ctx.call.races is not None or self.policy.actors
                      or ctx.call.timeline is not None)

    def inputs_ready(self, step: int) -> Generator[Wait | None, None, None]:
        """Before body `step`: its input blocks have landed; later ones are prefetched."""
        for plan in self.inputs:
            if plan.changed[step]:
                copy = self.fetching.pop((id(plan), step), None) or self._start(plan, step, False)
                yield from self._wait(copy)
        last = len(self.points)
        for plan in self.inputs:
            for ahead in range(step + 1, min(step + plan.depth, last)):
                if plan.changed[ahead] and (id(plan), ahead) not in self.fetching:
                    self.fetching[(id(plan), ahead)] = self._start(plan, ahead, False,
                                                                   during=step)

    def outputs_done(self, step: int) -> Generator[Wait | None, None, None]:
        """After body `step`: write back the output blocks it finished; wait for those
        started far enough back (one step, with the default double buffering)."""
        last = step == len(self.points) - 1
        for plan in self.outputs:
            if last or plan.changed[step + 1]:
                self.writing.append(self._start(plan, step, True))
        while self.writing and self.writing[0].step <= step - (self.writing[0].plan.depth - 1):
            yield from self._wait(self.writing.pop(0))

    def drain(self) -> Generator[Wait | None, None, None]:
        """The kernel's end: every write-back still in flight is waited."""
        while self.writing:
            yield from self._wait(self.writing.pop(0))

    def revisit(self, plan: _Plan, step: int) -> Generator[Wait | None, None, None]:
        """An output block visited again after other blocks. `RevisitMode.ANY`: the DMA
        the pipeline inserts to restore it from HBM, waited before the body (the earlier
        visit's write-back, single-buffered, was waited after its body). Otherwise fresh
        memory, as at any visit, and a read of it never written says why."""
        ctx = self.ctx
        if plan.restores:
            if ctx.call.ever_written is not None:  # the note of memory never touched
                assert plan.op.vmem is not None  # a blocked operand's VMEM block (simulate)
                ctx.call.ever_written.before_reset(plan.op.vmem)
            yield from self._wait(self._start(plan, step, False))
            return
        vmem = _fresh_block(ctx, plan, step)
        first = self.grid_points[plan.revisit_of[step]]
        ctx.call.fresh_revisits[vmem.id] = (
            f"{plan.op.name} holds output block {plan.blocks[step]}, visited at grid point"
            f" {first} and again at {self.grid_points[step]} after other blocks: the"
            f" pipeline does not read an output block back, so the revisit starts from"
            f" fresh memory (pl.Buffered(1, revisit=pl.RevisitMode.ANY) restores it)")

    def record_revisits(self) -> None:
        """Each output block this core visited in more than one run of steps, for the
        call to decide (revisit.py) whether the first visit's work survives."""
        for plan in self.outputs:
            for block in sorted(plan.revisited):
                visits = self.visits.get((id(plan), block), [])
                if len(visits) < 2:
                    continue
                start, stop = plan.first_run[block]
                inputs: dict[tuple[str, tuple[int, ...]], None] = {}
                for step in range(start, stop):
                    for other in self.inputs:  # (SMEM: sizes and indices, not data)
                        if other.op.kernel_space != MemorySpace.SMEM:
                            inputs[(other.op.name, other.blocks[step])] = None
                hbm_index, _, _, _ = _block_slices(plan.op, block)
                self.ctx.call.revisits.append(RevisitRecord(
                    self.ctx.device_id, self.ctx.actor, plan.op.name, plan.op.position,
                    block, hbm_index, plan.frames, plan.restores, visits,
                    tuple(self.grid_points[start:stop]), tuple(inputs)))

    def _start(self, plan: _Plan, step: int, writes_back: bool,
               during: int | None = None) -> BlockCopy:
        """Start the copy of step `step`'s block (`during`: the step running while a
        copy-in is fetched ahead)."""
        ctx = self.ctx
        block = plan.blocks[step]
        if not writes_back:
            plan.check_bounds(ctx, step, self.grid_points[step],
                              None if during is None else self.grid_points[during])
        name = (ctx.call.pipeline_copy_name(ctx, plan.op.name, writes_back, block)
                if self.named else "")
        copy = BlockCopy(plan, block, step, self.grid_points[step], writes_back, name,
                         _block_slices(plan.op, block), ctx.call)
        ctx.call.on_copy_start(ctx, name, plan.op.name, plan.copies % plan.depth)
        plan.copies += 1
        if writes_back:
            _stage_write_back(ctx, copy)
            if block in plan.revisited and copy.staged is not None:
                self.visits.setdefault((id(plan), block), []).append(
                    (copy.grid_point, copy.staged[1]))
        self.policy.started(ctx, copy)
        return copy

    def _wait(self, copy: BlockCopy) -> Generator[Wait | None, None, None]:
        ctx = self.ctx
        if not copy.copied:
            wait = self.policy.await_transfer(ctx, copy, "pipeline copy wait",
                                              copy.plan.frames)
            if wait is not None:
                yield wait
        if self.named:
            ctx.call.on_copy_waited(ctx, copy.actor_name)
        if not copy.writes_back:
            _land_in_vmem(ctx, copy)


def _revisit_any(op: Operand) -> bool:
    """Whether the block is `pl.Buffered(1, revisit=pl.RevisitMode.ANY)` (Mosaic rejects
    ANY with two buffers; the restoring read is modelled whatever the depth)."""
    mode = op.mapping.pipeline_mode
    revisit = getattr(mode, "revisit", None)
    return getattr(revisit, "value", None) == "any"


def _depth(op: Operand) -> int:
    """How many buffers the pipeline keeps for an operand (pl.Buffered(n); 2 by default)."""
    mode = op.mapping.pipeline_mode
    count = getattr(mode, "buffer_count", None)
    return max(1, int(count)) if count else 2


def _copy_actor(call: CallState, copy: BlockCopy) -> Generator[None, None, None]:
    """`--dma random`: the copy moves its data at a point the scheduler picks."""
    yield None
    _move(call, copy)


def _move(call: CallState, copy: BlockCopy) -> None:
    """The copy's DMA event: a copy-in reads HBM, a write-back writes it. What a copy-in
    read is its own: a view of a read-only input's array (which never changes), else a
    copy (HBM may change before the copy is waited)."""
    op = copy.plan.op
    hbm_index, _, empty, hbm_range = copy.slices
    copy.copied = True
    if not empty and copy.writes_back:
        assert copy.staged is not None  # (staged when the write-back started)
        values, written = copy.staged
        copy.staged = None
        op.hbm.writable()[hbm_index] = values
        op.hbm.mark_written(hbm_index, written)
    elif not empty:
        hbm = op.hbm
        values, written = hbm.data[hbm_index], hbm.written_at(hbm_index)
        if not hbm.read_only:
            values = np.array(values)
        if isinstance(written, np.ndarray):
            written = np.array(written)
        copy.staged = (values, written)
    touched = None if empty or call.races is None else hbm_range
    call.on_copy_moved(copy.actor_name, op.hbm, touched, copy.writes_back, copy.plan.frames,
                       copy.grid_point)


def _stage_write_back(ctx: CoreContext, copy: BlockCopy) -> None:
    """A write-back reads the output block when it starts: the core goes on in the other
    buffer, so the block's array is handed to the copy and the core gets a fresh one."""
    vmem = copy.plan.op.vmem
    assert vmem is not None
    _, vmem_index, empty, _ = copy.slices
    if empty:
        return
    written = vmem.written_at(vmem_index)
    if isinstance(written, np.ndarray):
        written = np.array(written)
    values = vmem.data
    vmem.data = np.empty_like(values)  # filled when the next block starts
    copy.staged = (values[vmem_index], written)


def _land_in_vmem(ctx: CoreContext, copy: BlockCopy) -> None:
    """A copy-in waited: the block is the kernel's input ref (its padding unwritten)."""
    vmem = copy.plan.op.vmem
    assert vmem is not None
    staged, copy.staged = copy.staged, None
    if staged is not None and staged[0].shape == vmem.data.shape:
        vmem.adopt(*staged)  # a whole block: no padding to fill, no copy to make
        return
    data = vmem.writable()
    data[...] = ctx.fill(data.dtype)
    vmem.mark_written(Ellipsis, False)
    if staged is None:
        return
    _, vmem_index, _, _ = copy.slices
    values, written = staged
    data[vmem_index] = values
    vmem.mark_written(vmem_index, written)


def _hbm_window(op: Operand, block_index: Sequence[int]) -> RefView:
    """The kernel's ref for an HBM operand whose BlockSpec selects a window of it."""
    indices = tuple(int(start) if sq else Slice(int(start), size)
                    for (start, size), sq in zip(op.block_window(block_index), op.squeezed))
    return RefView(op.hbm, (NDIndexer.from_indices_shape(indices,
                                                                        op.hbm.shape),))


def _block_slices(op: Operand, block_index: tuple[int, ...]
                  ) -> Slices:
    """Slices of the HBM array and of the VMEM block for the valid part of a block, and
    that part's HBM index range (what a copy of it touches, for the race checker)."""
    hbm_index: list[int | slice] = []
    vmem_index: list[slice] = []
    hbm_range: list[tuple[int, int]] = []
    empty = False
    for (start, size), n, sq, most in zip(op.block_window(block_index), op.hbm.shape,
                                          op.squeezed, op.block_sizes):
        # (a BoundedSlice larger than its block, out of bounds, moves what the block holds)
        lo, hi = max(start, 0), min(start + min(size, most), n)
        if hi <= lo:
            empty = True
            lo = hi = 0
        if sq:
            hbm_index.append(lo)
            hbm_range.append((lo, lo + 1))
        else:
            hbm_index.append(slice(lo, hi))
            hbm_range.append((lo, hi))
            vmem_index.append(slice(lo - start, hi - start) if not empty else slice(0, 0))
    return tuple(hbm_index), tuple(vmem_index), empty, tuple(hbm_range)


def _check_block_bounds(ctx: CoreContext, op: Operand, block_index: tuple[int, ...],
                        point: tuple[int, ...], during: tuple[int, ...] | None) -> bool:
    bad = []
    for d, ((start, size), n, elem, (low, high), most) in enumerate(
            zip(op.block_window(block_index), op.hbm.shape, op.element, op.element_bounds(),
                op.block_sizes)):
        if elem and (start < low or start + size > high or not 0 <= size <= most):
            bad.append(d)
        elif not elem and (start < 0 or start >= n):
            bad.append(d)
    if not bad:
        return True
    ctx.call.block_out_of_bounds(ctx, op, block_index, bad, _index_map_frames(op), point,
                                 during)
    return False


def _index_map_frames(op: Operand) -> tuple[SourceFrame, ...]:
    """Where the operand's BlockSpec index_map is defined (pipeline copies have no line)."""
    _, file, line = parse_src_info(source_text(op.mapping.index_map.jaxpr))
    return (SourceFrame(file, line, "index_map", code_line(file, line)),) if file else ()


def _finish_dmas(ctx: CoreContext, report: bool = True) -> None:
    """DMAs still in flight complete at kernel end (as the DMA mode drains them); those
    never waited are findings."""
    state = ctx.call
    state.dma_policy.drain(ctx, state.sync.dmas)
    if report:
        state.dmas_not_waited()

