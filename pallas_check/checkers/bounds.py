"""Out-of-bounds accesses: loads, stores and DMA slices outside their ref, and BlockSpec
blocks outside their array. The engine goes on (reads give the fill, writes drop)."""

from __future__ import annotations


import numpy as np


from typing import TYPE_CHECKING, Sequence

from pallas_check.engine.memory.buffer import MemorySpace
from pallas_check.engine.memory.region import Region
from pallas_check.findings import Finding, FindingKind, SourceFrame, format_range


if TYPE_CHECKING:  # only for annotations
    from pallas_check.engine.call.state import CallState, CoreContext
    from pallas_check.engine.call.describe import Operand


def masked_oob(region: Region, mask: np.ndarray) -> bool:
    """Whether any element the mask selects lies outside the buffer."""
    valid = np.ones((), bool)
    shapes = []
    for d, n in zip(region.dims, region.buffer.shape):
        if isinstance(d, int):
            continue
        idx = d[0] + d[2] * np.arange(d[1])
        shapes.append(((idx >= 0) & (idx < n)))
    for axis, m in enumerate(shapes):
        shape = [1] * len(shapes)
        shape[axis] = m.shape[0]
        valid = valid & m.reshape(shape)
    scalar_oob = any(isinstance(d, int) and not (0 <= d < n)
                     for d, n in zip(region.dims, region.buffer.shape))
    mask = np.broadcast_to(mask, region.out_shape)
    if scalar_oob:
        return bool(mask.any())
    return bool((mask & ~np.broadcast_to(valid, mask.shape)).any())


def access_finding(state: CallState, ctx: CoreContext, region: Region, operation: str,
                   frames: tuple[SourceFrame, ...]) -> Finding:
    """A load, store or DMA slice (`operation`) that reaches outside its buffer."""
    buf = region.buffer
    detail = ", ".join(f"index {o.index} in dimension {o.dim} of size {o.size}"
                       for o in region.oob)
    return Finding(
        kind=FindingKind.OUT_OF_BOUNDS,
        message=f"{operation} of {buf.name}{format_range(region.index_range())} is out of"
                f" bounds of {buf.name} (shape {list(buf.shape)}): {detail}",
        kernel=state.kernel, call_index=state.call_index, grid_point=ctx.grid_point,
        actor=ctx.actor, buffer=buf.name, memory_space=buf.space,
        index_range=region.index_range(), frames=frames,
        details={"operation": operation, "shape": list(buf.shape)},
    )


def block_finding(ctx: CoreContext, op: Operand, block_index: tuple[int, ...],
                  bad_dims: Sequence[int], frames: tuple[SourceFrame, ...]) -> Finding:
    """A BlockSpec index map that selects a block outside the operand's array."""
    rng = tuple((start, start + size) for start, size in op.block_window(block_index))
    return Finding(
        kind=FindingKind.OUT_OF_BOUNDS,
        message=f"block index {op.describe(block_index)} of {op.name} selects {op.name}{format_range(rng)},"
                f" outside the array of shape {list(op.hbm.shape)} (dimension"
                f"{'s' if len(bad_dims) > 1 else ''} {', '.join(map(str, bad_dims))})",
        kernel=ctx.call.kernel, call_index=ctx.call.call_index, grid_point=ctx.grid_point,
        actor=ctx.actor, buffer=op.name, memory_space=MemorySpace.HBM, index_range=rng,
        frames=frames,
        details={"operation": "block " + ("write-back" if op.is_output else "copy-in"),
                 "block_index": list(block_index), "shape": list(op.hbm.shape)},
    )


def device_finding(state: CallState, ctx: CoreContext, device: str, what: str,
                   frames: tuple[SourceFrame, ...]) -> Finding:
    """A DMA or semaphore signal aimed at a device outside the mesh (a wrapped-around ring
    neighbour computed as `me - 1` without the modulo, say)."""
    mesh = ", ".join(f"{name}: {size}" for name, size in state.mesh.axes) or "1 device"
    return Finding(
        kind=FindingKind.OUT_OF_BOUNDS,
        message=f"{device} is outside the device mesh ({mesh}): {what} out of range; the"
                f" call's simulation stops here",
        kernel=state.kernel, call_index=state.call_index, grid_point=ctx.grid_point,
        actor=ctx.actor, buffer="device mesh", memory_space="", index_range=None,
        frames=frames, details={"operation": "device id", "device_id": device,
                                "mesh": dict(state.mesh.axes)},
    )
