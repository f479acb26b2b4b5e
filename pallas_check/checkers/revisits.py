"""The BlockSpec pipeline: an output block visited again after other blocks loses what an
earlier visit did unless that still reaches the block's final value (engine/call/revisit.py
decides it: by a re-run with the first visit's input blocks perturbed, or, where that
cannot tell, by what the last visit wrote)."""

from __future__ import annotations

from pallas_check.checkers.base import Checker
from pallas_check.engine.events import RevisitLost
from pallas_check.engine.memory.buffer import MemorySpace
from pallas_check.findings.finding import Finding, FindingKind, format_range
from pallas_check.findings.units import plural


class RevisitChecker(Checker):
    def on_revisit_lost(self, event: RevisitLost) -> None:
        self.sink.emit(lost_values_finding(self, event))


def lost_values_finding(checker: Checker, lost: RevisitLost) -> Finding:
    """`output-revisited` at the out_specs index_map: both visits, what was lost."""
    r = lost
    where = f"{r.output}{format_range(lost.index_range)}"
    if lost.by_flow:
        inputs = ", ".join(f"{name} block {block}" for name, block in r.inputs[:4])
        more = f" and {len(r.inputs) - 4} more" if len(r.inputs) > 4 else ""
        why = ("the pipeline read the block back (RevisitMode.ANY), and the kernel"
               " overwrote it" if r.restored else
               "on a TPU the pipeline does not read an output block back, and the last"
               " visit's write-back lands last")
        message = (f"output block {r.block} of {r.output}, visited at grid point"
                   f" {r.first_point}, is visited again at {r.last_point} after other"
                   f" blocks, and nothing the first visit consumed ({inputs}{more}) reaches"
                   f" the block's final value (a re-run with those input blocks perturbed"
                   f" gives the same block): {why}, so the {plural(lost.elements, 'element')}"
                   f" in {where} the first visit produced"
                   f" {'is' if lost.elements == 1 else 'are'} lost")
    else:
        message = (f"output block {r.block} of {r.output} is visited again at grid point"
                   f" {r.last_point} after other blocks; {plural(lost.elements, 'element')}"
                   f" in {where} written at grid point {lost.earlier_point}"
                   f" {'is' if lost.elements == 1 else 'are'} not written"
                   f" again by the last visit: on a TPU the pipeline does not read the block"
                   f" back, and the last write-back overwrites them")
    return Finding(
        kind=FindingKind.OUTPUT_REVISITED, message=message,
        kernel=checker.call.kernel, call_index=checker.call.call_index, grid_point=r.last_point,
        actor=r.actor, buffer=r.output, memory_space=MemorySpace.HBM,
        index_range=lost.index_range, frames=r.frames,
        details={"block_index": list(r.block), "elements": lost.elements,
                 "earlier_grid_point": list(lost.earlier_point),
                 "last_grid_point": list(r.last_point),
                 "decided_by": "perturbation" if lost.by_flow else "writes",
                 "first_visit_inputs": [[name, list(block)] for name, block in r.inputs]},
    )
