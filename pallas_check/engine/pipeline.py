"""The BlockSpec pipeline of one core: the grid walk, block copies in and out, HBM windows,
and DMAs still in flight at the end."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np
from pallas_check.jaxbridge import jax_core
from pallas_check.jaxbridge import state_indexing

from pallas_check.config import DmaMode
from pallas_check.engine import sync
from pallas_check.engine.evaluate import eval_jaxpr
from pallas_check.engine.scheduler import Actor, Wait
from pallas_check.engine.memory import RefView
from pallas_check.findings import IndexRange, SourceFrame
from pallas_check.sourceinfo import code_line, parse_src_info


from pallas_check.engine.call import Operand
from pallas_check.engine.state import CoreContext


def _core_body(ctx: CoreContext, jaxpr: jax_core.Jaxpr, kernel_args: list[Any],
               operands: list[Operand], points: np.ndarray):
    """The actor of one core: the grid walk with the block pipeline around each step."""
    blocked = [op for op in operands if not op.whole_array]
    outputs = [op for op in blocked if op.is_output]
    windowed = [op for op in operands if op.whole_array and op.block_indices is not None]
    visited: dict[int, set[tuple[int, ...]]] = {id(op): set() for op in outputs}
    pipe = Pipeline(ctx, [op for op in blocked if not op.is_output], outputs, points)
    num_steps = len(points)
    for step in range(num_steps):
        point = tuple(int(x) for x in points[step])
        ctx.grid_point = point
        ctx.eqn = None
        yield None  # a scheduling point: another core may run a step here
        for op in windowed:
            kernel_args[op.position] = _hbm_window(op, op.block_indices[step])  # type: ignore[index]
        yield from pipe.inputs_ready(step)
        for op in outputs:
            if pipe.changes(op, step):
                key = pipe.block(op, step)
                if key in visited[id(op)]:
                    ctx.call.checkers.block_revisited(ctx, op, key, _index_map_frames(op))
                _check_block_bounds(ctx, op, key)
                assert op.vmem is not None
                op.vmem.data[...] = ctx.fill(op.vmem.data.dtype)
                op.vmem.mark_written(Ellipsis, False)
        yield from eval_jaxpr(ctx, jaxpr, (), kernel_args)
        ctx.eqn = None
        for op in outputs:
            if step == num_steps - 1 or pipe.changes(op, step + 1):
                visited[id(op)].add(pipe.block(op, step))
        yield from pipe.outputs_done(step)
    yield from pipe.drain()
    if ctx.call.races is not None:
        ctx.call.races.end(ctx.actor)  # the core's grid is done: it accesses nothing more


@dataclasses.dataclass(eq=False)
class BlockCopy:
    """One copy of the BlockSpec pipeline, a DMA of its own (an actor in `--dma random`):
    a copy-in reads an input block from HBM for grid step `step`; a write-back writes the
    output block of `step` to HBM. `staged` holds what it read (values, written-shadow)."""

    op: Operand
    block: tuple[int, ...]
    step: int
    grid_point: tuple[int, ...]
    writes_back: bool
    name: str
    frames: tuple[SourceFrame, ...]
    staged: Any = None
    moved: bool = False  # copy-in: HBM was read; write-back: HBM was written


class Pipeline:
    """A core's BlockSpec pipeline, as a TPU runs it (JAX's pipelining docs): the copy-in
    of step i+1's changed input blocks starts before body i and is waited before body i+1;
    the write-back of step i's output block starts after body i and is waited after body
    i+1 (the last ones at the end); a block whose index does not change is neither fetched
    nor written back; `pipeline_mode=pl.Buffered(n)` sets how many steps ahead (n-1) it
    runs. Each copy takes part in race detection as its own actor, ordered after what
    its core did before starting it and before what the core does after waiting it."""

    def __init__(self, ctx: CoreContext, inputs: list[Operand], outputs: list[Operand],
                 points: np.ndarray) -> None:
        self.ctx = ctx
        self.inputs = inputs
        self.outputs = outputs
        self.points = points
        self.fetching: dict[tuple[int, int], BlockCopy] = {}  # (op id, step) -> copy-in
        self.writing: list[BlockCopy] = []  # write-backs in flight, oldest first

    @staticmethod
    def block(op: Operand, step: int) -> tuple[int, ...]:
        return tuple(int(i) for i in op.block_indices[step])  # type: ignore[index]

    @staticmethod
    def changes(op: Operand, step: int) -> bool:
        """Whether the block of `op` at `step` differs from the one before it."""
        indices = op.block_indices
        assert indices is not None
        return step == 0 or not np.array_equal(indices[step], indices[step - 1])

    def inputs_ready(self, step: int):
        """Before body `step`: its input blocks have landed; later ones are prefetched."""
        for op in self.inputs:
            if self.changes(op, step):
                copy = self.fetching.pop((id(op), step), None) or self._start(op, step, False)
                yield from self._wait(copy)
        for op in self.inputs:
            for ahead in range(step + 1, min(step + _depth(op), len(self.points))):
                if self.changes(op, ahead) and (id(op), ahead) not in self.fetching:
                    self.fetching[(id(op), ahead)] = self._start(op, ahead, False)

    def outputs_done(self, step: int):
        """After body `step`: write back the output blocks it finished; wait for those
        started far enough back (one step, with the default double buffering)."""
        last = step == len(self.points) - 1
        for op in self.outputs:
            if last or self.changes(op, step + 1):
                self.writing.append(self._start(op, step, True))
        while self.writing and self.writing[0].step <= step - (_depth(self.writing[0].op) - 1):
            yield from self._wait(self.writing.pop(0))

    def drain(self):
        """The kernel's end: every write-back still in flight is waited."""
        while self.writing:
            yield from self._wait(self.writing.pop(0))

    def _start(self, op: Operand, step: int, writes_back: bool) -> BlockCopy:
        ctx = self.ctx
        block = self.block(op, step)
        if not writes_back:
            _check_block_bounds(ctx, op, block)
        copy = BlockCopy(op, block, step, tuple(int(x) for x in self.points[step]), writes_back,
                         ctx.call.pipeline_copy_name(ctx, op.name, writes_back, block),
                         _index_map_frames(op))
        if ctx.call.races is not None:
            ctx.call.races.fork(ctx.actor, copy.name)
        if writes_back:
            _stage_write_back(ctx, copy)
        mode = ctx.config.dma_mode
        if mode == DmaMode.EAGER:
            _move(ctx, copy, detach=True)
        elif mode == DmaMode.RANDOM:
            ctx.call.scheduler.spawn(Actor(copy.name, _copy_actor(ctx, copy)))
        return copy

    def _wait(self, copy: BlockCopy):
        ctx = self.ctx
        if not copy.moved:
            if ctx.config.dma_mode == DmaMode.RANDOM:
                yield Wait(lambda: copy.moved, "pipeline copy wait", copy.frames)
            else:
                _move(ctx, copy, detach=False)
        if ctx.call.races is not None:
            ctx.call.races.join_finished(ctx.actor, copy.name)
        ctx.call.copy_done(copy.name)
        if not copy.writes_back:
            _land_in_vmem(ctx, copy)


def _depth(op: Operand) -> int:
    """How many buffers the pipeline keeps for an operand (pl.Buffered(n); 2 by default)."""
    mode = getattr(op.mapping, "pipeline_mode", None)
    count = getattr(mode, "buffer_count", None)
    return max(1, int(count)) if count else 2


def _copy_actor(ctx: CoreContext, copy: BlockCopy):
    """`--dma random`: the copy moves its data at a point the scheduler picks."""
    yield None
    _move(ctx, copy, detach=True)


def _move(ctx: CoreContext, copy: BlockCopy, detach: bool) -> None:
    """The copy's DMA event: a copy-in reads HBM, a write-back writes it. `detach`: the
    read happens before the wait, so what it read is copied out of HBM (HBM may change in
    between; a read-only input's array never does)."""
    op, races = copy.op, ctx.call.races
    hbm_index, _, empty = _block_slices(op, copy.block)
    copy.moved = True
    if not empty and copy.writes_back:
        values, written = copy.staged
        copy.staged = None
        op.hbm.writable()[hbm_index] = values
        op.hbm.mark_written(hbm_index, written)
    elif not empty:
        hbm = op.hbm
        values, written = hbm.data[hbm_index], hbm.written_at(hbm_index)
        if detach and not hbm.read_only:
            values = np.array(values)
        if detach and isinstance(written, np.ndarray):
            written = np.array(written)
        copy.staged = (values, written)
    if races is not None:
        if not empty:
            races.access(copy.name, op.hbm, _hbm_range(hbm_index), copy.writes_back,
                         "DMA write" if copy.writes_back else "DMA read", copy.frames,
                         copy.grid_point)
        races.end(copy.name)


def _stage_write_back(ctx: CoreContext, copy: BlockCopy) -> None:
    """A write-back reads the output block when it starts: the core goes on in the other
    buffer, so the block's array is handed to the copy and the core gets a fresh one."""
    vmem = copy.op.vmem
    assert vmem is not None
    _, vmem_index, empty = _block_slices(copy.op, copy.block)
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
    vmem = copy.op.vmem
    assert vmem is not None
    vmem.data[...] = ctx.fill(vmem.data.dtype)
    vmem.mark_written(Ellipsis, False)
    if copy.staged is None:
        return
    _, vmem_index, _ = _block_slices(copy.op, copy.block)
    values, written = copy.staged
    copy.staged = None
    vmem.data[vmem_index] = values
    vmem.mark_written(vmem_index, written)


def _hbm_window(op: Operand, block_index: Sequence[int]) -> RefView:
    """The kernel's ref for an HBM operand whose BlockSpec selects a window of it."""
    indices = tuple(int(start) if sq else state_indexing.Slice(int(start), size)
                    for (start, size), sq in zip(op.block_window(block_index), op.squeezed))
    return RefView(op.hbm, (state_indexing.NDIndexer.from_indices_shape(indices,
                                                                        op.hbm.shape),))


def _block_slices(op: Operand, block_index: tuple[int, ...]
                  ) -> tuple[tuple, tuple, bool]:
    """Slices of the HBM array and of the VMEM block for the valid part of a block."""
    hbm_index, vmem_index = [], []
    empty = False
    for (start, size), n, sq in zip(op.block_window(block_index), op.hbm.shape, op.squeezed):
        lo, hi = max(start, 0), min(start + size, n)
        if hi <= lo:
            empty = True
            lo = hi = 0
        if sq:
            hbm_index.append(lo)
        else:
            hbm_index.append(slice(lo, hi))
            vmem_index.append(slice(lo - start, hi - start) if not empty else slice(0, 0))
    return tuple(hbm_index), tuple(vmem_index), empty


def _check_block_bounds(ctx: CoreContext, op: Operand, block_index: tuple[int, ...]) -> bool:
    bad = []
    for d, ((start, size), n, elem) in enumerate(
            zip(op.block_window(block_index), op.hbm.shape, op.element)):
        if start < 0 or start >= n or (elem and start + size > n):
            bad.append(d)
    if not bad:
        return True
    ctx.call.add(ctx.call.checkers.block_out_of_bounds(ctx, op, block_index, bad,
                                                      _index_map_frames(op)))
    return False


def _hbm_range(index: tuple) -> IndexRange:
    return tuple((i, i + 1) if isinstance(i, int) else (i.start, i.stop) for i in index)


def _index_map_frames(op: Operand) -> tuple[SourceFrame, ...]:
    """Where the operand's BlockSpec index_map is defined (pipeline copies have no line)."""
    info = op.mapping.index_map_jaxpr.jaxpr.debug_info
    _, file, line = parse_src_info(getattr(info, "func_src_info", None))
    return (SourceFrame(file, line, "index_map", code_line(file, line)),) if file else ()


def _finish_dmas(ctx: CoreContext, report: bool = True) -> None:
    """DMAs still in flight complete at kernel end; those never waited are findings."""
    state = ctx.call
    for dma in state.sync.dmas:
        if not dma.copied:
            sync.complete(ctx, dma)
    if report:
        for finding in state.checkers.dmas_not_waited(state):
            state.add(finding)

