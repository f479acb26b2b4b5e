"""The BlockSpec pipeline of one core: the grid walk, block copies in and out, HBM windows,
and DMAs still in flight at the end."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from pallas_check.jaxbridge import jax_core
from pallas_check.jaxbridge import state_indexing

from pallas_check.engine import sync
from pallas_check.engine.evaluate import eval_jaxpr
from pallas_check.engine.memory import RefView
from pallas_check.findings import IndexRange, SourceFrame
from pallas_check.sourceinfo import code_line, parse_src_info


from pallas_check.engine.call import Operand
from pallas_check.engine.state import CoreContext


def _core_body(ctx: CoreContext, jaxpr: jax_core.Jaxpr, kernel_args: list[Any],
               operands: list[Operand], points: np.ndarray):
    """The actor of one core: the grid walk with the block pipeline around each step."""
    blocked = [op for op in operands if not op.whole_array]
    inputs = [op for op in blocked if not op.is_output]
    outputs = [op for op in blocked if op.is_output]
    windowed = [op for op in operands if op.whole_array and op.block_indices is not None]
    visited: dict[int, set[tuple[int, ...]]] = {id(op): set() for op in outputs}
    num_steps = len(points)
    for step in range(num_steps):
        point = tuple(int(x) for x in points[step])
        ctx.grid_point = point
        ctx.eqn = None
        yield None  # a scheduling point: another core may run a step here
        ctx.call.on_grid_step(ctx, point)  # timeline: a grid step's slice begins
        for op in windowed:
            kernel_args[op.position] = _hbm_window(op, op.block_indices[step])  # type: ignore[index]
        for op in inputs:
            idx = op.block_indices[step]  # type: ignore[index]
            if step == 0 or not np.array_equal(idx, op.block_indices[step - 1]):  # type: ignore[index]
                _copy_in(ctx, op, tuple(int(i) for i in idx))
        for op in outputs:
            idx = op.block_indices[step]  # type: ignore[index]
            key = tuple(int(i) for i in idx)
            if step == 0 or not np.array_equal(idx, op.block_indices[step - 1]):  # type: ignore[index]
                if key in visited[id(op)]:
                    ctx.call.checkers.block_revisited(ctx, op, key, _index_map_frames(op))
                _check_block_bounds(ctx, op, key)
                assert op.vmem is not None
                op.vmem.data[...] = ctx.fill(op.vmem.data.dtype)
                op.vmem.mark_written(Ellipsis, False)
        yield from eval_jaxpr(ctx, jaxpr, (), kernel_args)
        ctx.eqn = None
        for op in outputs:
            idx = op.block_indices[step]  # type: ignore[index]
            last = step == num_steps - 1
            if last or not np.array_equal(idx, op.block_indices[step + 1]):  # type: ignore[index]
                key = tuple(int(i) for i in idx)
                _copy_out(ctx, op, key)
                visited[id(op)].add(key)
    if ctx.call.races is not None:
        ctx.call.races.end(ctx.actor)  # the core's grid is done: it accesses nothing more
    ctx.call.on_core_done(ctx)  # timeline: the last grid step's slice ends


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


def _copy_in(ctx: CoreContext, op: Operand, block_index: tuple[int, ...]) -> None:
    assert op.vmem is not None
    _check_block_bounds(ctx, op, block_index)
    vmem = op.vmem
    hbm_index, vmem_index, empty = _block_slices(op, block_index)
    vmem.data[...] = ctx.fill(vmem.data.dtype)
    vmem.mark_written(Ellipsis, False)
    if empty:
        return
    vmem.data[vmem_index] = op.hbm.data[hbm_index]
    vmem.mark_written(vmem_index, op.hbm.written_at(hbm_index))
    if ctx.call.races is not None:
        ctx.call.races.access(ctx.actor, op.hbm, _hbm_range(hbm_index), False,
                              "block copy-in", _index_map_frames(op), ctx.grid_point)


def _copy_out(ctx: CoreContext, op: Operand, block_index: tuple[int, ...]) -> None:
    assert op.vmem is not None
    hbm_index, vmem_index, empty = _block_slices(op, block_index)
    if empty:
        return
    hbm = op.hbm
    hbm.writable()[hbm_index] = op.vmem.data[vmem_index]
    hbm.mark_written(hbm_index, op.vmem.written_at(vmem_index))
    if ctx.call.races is not None:
        ctx.call.races.access(ctx.actor, hbm, _hbm_range(hbm_index), True,
                              "block write-back", _index_map_frames(op), ctx.grid_point)


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

