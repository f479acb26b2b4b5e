"""The BlockSpec pipeline: an output block visited again after other blocks loses its first
write-back on a TPU."""

from __future__ import annotations

from typing import TYPE_CHECKING


from pallas_check.findings import Finding, FindingKind, SourceFrame
from pallas_check.engine.memory import MemorySpace
from pallas_check.sourceinfo import parse_src_info, code_line

if TYPE_CHECKING:  # only for annotations: the engine imports these checkers
    from pallas_check.engine.kernel import CoreContext, Operand


def revisit_finding(ctx: CoreContext, op: Operand, block_index: tuple[int, ...]) -> None:
    window = op.block_window(block_index)
    rng = tuple((s, s + z) for s, z in window)
    info = op.mapping.index_map_jaxpr.jaxpr.debug_info
    _, file, line = parse_src_info(getattr(info, "func_src_info", None))
    frames = (SourceFrame(file, line, "index_map", code_line(file, line)),) if file else ()
    ctx.call.add(Finding(
        kind=FindingKind.OUTPUT_REVISITED,
        message=f"output block {block_index} of {op.name} is visited again after other blocks"
                f" at grid point {ctx.grid_point}; on a TPU its earlier contents are not"
                f" read back, so the earlier write-back is overwritten",
        kernel=ctx.call.kernel, call_index=ctx.call.call_index, grid_point=ctx.grid_point,
        actor=ctx.actor, buffer=op.name, memory_space=MemorySpace.HBM, index_range=rng,
        frames=frames, details={"block_index": list(block_index)},
    ))
