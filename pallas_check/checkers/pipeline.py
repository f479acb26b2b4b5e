"""The BlockSpec pipeline: an output block visited again after other blocks loses what an
earlier visit did unless that still reaches the block's final value (engine/call/revisit.py
decides it: by a re-run with the first visit's input blocks perturbed, or, where that
cannot tell, by what the last visit wrote)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pallas_check.findings import Finding, FindingKind, format_range
from pallas_check.engine.memory.buffer import MemorySpace

if TYPE_CHECKING:  # only for annotations
    from pallas_check.engine.call.revisit import Lost
    from pallas_check.engine.call.state import CallState


def lost_values_finding(state: CallState, lost: Lost) -> Finding:
    """`output-revisited` at the out_specs index_map: both visits, what was lost."""
    r = lost.record
    where = f"{r.name}{format_range(lost.index_range)}"
    if lost.by_flow:
        inputs = ", ".join(f"{name} block {block}" for name, block in r.inputs[:4])
        more = f" and {len(r.inputs) - 4} more" if len(r.inputs) > 4 else ""
        why = ("the pipeline read the block back (RevisitMode.ANY), and the kernel"
               " overwrote it" if r.restored else
               "on a TPU the pipeline does not read an output block back, and the last"
               " visit's write-back lands last")
        message = (f"output block {r.block} of {r.name}, visited at grid point"
                   f" {r.first_point}, is visited again at {r.last_point} after other"
                   f" blocks, and nothing the first visit consumed ({inputs}{more}) reaches"
                   f" the block's final value (a re-run with those input blocks perturbed"
                   f" gives the same block): {why}, so the {lost.elements} element(s) in"
                   f" {where} the first visit produced are lost")
    else:
        message = (f"output block {r.block} of {r.name} is visited again at grid point"
                   f" {r.last_point} after other blocks; {lost.elements} element(s) in"
                   f" {where} written at grid point {lost.earlier_point} are not written"
                   f" again by the last visit: on a TPU the pipeline does not read the block"
                   f" back, and the last write-back overwrites them")
    return Finding(
        kind=FindingKind.OUTPUT_REVISITED, message=message,
        kernel=state.kernel, call_index=state.call_index, grid_point=r.last_point,
        actor=r.actor, buffer=r.name, memory_space=MemorySpace.HBM,
        index_range=lost.index_range, frames=r.frames,
        details={"block_index": list(r.block), "elements": lost.elements,
                 "earlier_grid_point": list(lost.earlier_point),
                 "last_grid_point": list(r.last_point),
                 "decided_by": "perturbation" if lost.by_flow else "writes",
                 "first_visit_inputs": [[name, list(block)] for name, block in r.inputs]},
    )
