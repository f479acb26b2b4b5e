"""Out-of-bounds accesses: loads, stores and DMA slices outside their ref, and BlockSpec
blocks outside their array. The engine goes on (reads give the fill, writes drop)."""

from __future__ import annotations

from pallas_check.checkers.base import Checker
from pallas_check.engine.events import BlockOutOfBounds, DeviceOutOfBounds, OutOfBounds
from pallas_check.engine.memory.buffer import MemorySpace
from pallas_check.findings.finding import Finding, FindingKind, format_range


class BoundsChecker(Checker):
    def on_out_of_bounds(self, event: OutOfBounds) -> None:
        self.sink.emit(access_finding(self, event))

    def on_block_out_of_bounds(self, event: BlockOutOfBounds) -> None:
        self.sink.emit(block_finding(self, event))

    def on_device_out_of_bounds(self, event: DeviceOutOfBounds) -> None:
        self.sink.emit(device_finding(self, event))


def access_finding(checker: Checker, e: OutOfBounds) -> Finding:
    """A load, store or DMA slice (`operation`) that reaches outside its buffer."""
    detail = ", ".join(f"index {index} in dimension {dim} of size {size}"
                       for index, dim, size in e.outside)
    return Finding(
        kind=FindingKind.OUT_OF_BOUNDS,
        message=f"{e.operation} of {e.buffer}{format_range(e.index_range)} is out of"
                f" bounds of {e.buffer} (shape {list(e.shape)}): {detail}",
        kernel=checker.call.kernel, call_index=checker.call.call_index,
        grid_point=e.where.grid_point, actor=e.where.actor, buffer=e.buffer,
        memory_space=e.memory_space, index_range=e.index_range, frames=e.where.frames,
        details={"operation": e.operation, "shape": list(e.shape)},
    )


def block_finding(checker: Checker, e: BlockOutOfBounds) -> Finding:
    """A BlockSpec index map that selects a block outside the operand's array, at the grid
    point whose index map chose it (and when the pipeline fetched it ahead, during which)."""
    bad_dims = e.bad_dims
    point = e.where.grid_point
    at = f" at grid point {point}" if point is not None else ""
    ahead = (f"; the pipeline prefetches it during grid point {e.prefetched_at}"
             if e.prefetched_at is not None else "")
    return Finding(
        kind=FindingKind.OUT_OF_BOUNDS,
        message=f"block index {e.described} of {e.operand}, chosen by its index map{at},"
                f" selects {e.operand}{format_range(e.index_range)},"
                f" outside the array of shape {list(e.shape)} (dimension"
                f"{'s' if len(bad_dims) > 1 else ''} {', '.join(map(str, bad_dims))}){ahead}",
        kernel=checker.call.kernel, call_index=checker.call.call_index,
        grid_point=point, actor=e.where.actor, buffer=e.operand,
        memory_space=MemorySpace.HBM, index_range=e.index_range, frames=e.where.frames,
        details={"operation": "block " + ("write-back" if e.is_output else "copy-in"),
                 "block_index": list(e.block_index), "shape": list(e.shape),
                 "prefetched_at": None if e.prefetched_at is None else list(e.prefetched_at)},
        help=block_help(e),
    )


def block_help(e: BlockOutOfBounds) -> str:
    """The index map, the grid point whose block it got wrong, and by how much."""
    frame = e.where.frames[0] if e.where.frames else None
    index_map = f"the index map at {frame.file}:{frame.line}" if frame else "the index map"
    point = e.where.grid_point
    at = f" at grid point {point}" if point is not None else ""
    outside = "; ".join(f"it covers {e.index_range[d][0]}:{e.index_range[d][1]} of dimension"
                        f" {d}, which has {e.shape[d]} element{'s' if e.shape[d] != 1 else ''}"
                        for d in e.bad_dims)
    return (f"{index_map} returns block {e.described}{at} ({outside}): make it return"
            f" a block inside {e.operand} at every grid point (clamp it, e.g. with"
            f" jnp.minimum), or shrink the grid")


def device_finding(checker: Checker, e: DeviceOutOfBounds) -> Finding:
    """A DMA or semaphore signal aimed at a device outside the mesh (a wrapped-around ring
    neighbour computed as `me - 1` without the modulo, say)."""
    mesh = ", ".join(f"{name}: {size}" for name, size in e.mesh) or "1 device"
    return Finding(
        kind=FindingKind.OUT_OF_BOUNDS,
        message=f"{e.device} is outside the device mesh ({mesh}): {e.what} out of range; the"
                f" call's simulation stops here",
        kernel=checker.call.kernel, call_index=checker.call.call_index,
        grid_point=e.where.grid_point, actor=e.where.actor, buffer="device mesh",
        memory_space="", index_range=None, frames=e.where.frames,
        details={"operation": "device id", "device_id": e.device, "mesh": dict(e.mesh)},
    )
