"""The BlockSpec pipeline: an output block visited again after other blocks loses what an
earlier visit wrote unless the last visit writes it again."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pallas_check.findings import Finding, FindingKind, IndexRange, SourceFrame, format_range
from pallas_check.engine.memory import MemorySpace

if TYPE_CHECKING:  # only for annotations
    from pallas_check.engine.kernel import CoreContext, Operand


def lost_values_finding(ctx: CoreContext, op: Operand, block_index: tuple[int, ...],
                        lost_range: IndexRange, count: int, earlier_point: tuple,
                        last_point: tuple, frames: tuple[SourceFrame, ...]) -> None:
    """Elements an earlier visit of an output block wrote that its last visit did not
    (`frames`: the out_specs index_map's line)."""
    ctx.call.add(Finding(
        kind=FindingKind.OUTPUT_REVISITED,
        message=f"output block {op.describe(block_index)} of {op.name} is visited again at grid point"
                f" {last_point} after other blocks; {count} element(s) in"
                f" {op.name}{format_range(lost_range)} written at grid point {earlier_point}"
                f" are not written again by the last visit: on a TPU the pipeline does not"
                f" read the block back, and the last write-back overwrites them",
        kernel=ctx.call.kernel, call_index=ctx.call.call_index, grid_point=last_point,
        actor=ctx.actor, buffer=op.name, memory_space=MemorySpace.HBM, index_range=lost_range,
        frames=frames, details={"block_index": list(block_index), "elements": count,
                                "earlier_grid_point": list(earlier_point),
                                "last_grid_point": list(last_point)},
    ))
