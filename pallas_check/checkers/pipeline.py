"""The BlockSpec pipeline: an output block visited again after other blocks loses its first
write-back on a TPU."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pallas_check.findings import Finding, FindingKind, SourceFrame
from pallas_check.engine.memory import MemorySpace

if TYPE_CHECKING:  # only for annotations
    from pallas_check.engine.kernel import CoreContext, Operand


def revisit_finding(ctx: CoreContext, op: Operand, block_index: tuple[int, ...],
                    frames: tuple[SourceFrame, ...]) -> None:
    """An output block visited again after others (`frames`: its index_map's line)."""
    window = op.block_window(block_index)
    rng = tuple((s, s + z) for s, z in window)
    ctx.call.add(Finding(
        kind=FindingKind.OUTPUT_REVISITED,
        message=f"output block {block_index} of {op.name} is visited again after other blocks"
                f" at grid point {ctx.grid_point}; on a TPU its earlier contents are not"
                f" read back, so the earlier write-back is overwritten",
        kernel=ctx.call.kernel, call_index=ctx.call.call_index, grid_point=ctx.grid_point,
        actor=ctx.actor, buffer=op.name, memory_space=MemorySpace.HBM, index_range=rng,
        frames=frames, details={"block_index": list(block_index)},
    ))
