"""Uninitialized memory: reads of never-written elements, and whether they reached an
output (the call is re-run with another fill and the outputs compared); output elements
the kernel never wrote."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from pallas_check.checkers.base import Checker
from pallas_check.engine.call.exposures import differs
from pallas_check.engine.events import (DmaAddressCompared, FillsCompared, OutputUnwritten,
                                        UninitRead)
from pallas_check.engine.memory.buffer import MemorySpace
from pallas_check.findings import (
    Access, Finding, FindingKind, IndexRange, SourceFrame, format_range)
from pallas_check.sourceinfo import code_line


class UninitChecker(Checker):
    def on_output_unwritten(self, event: OutputUnwritten) -> None:
        self.sink.emit(unwritten_finding(self, event))

    def on_fills_compared(self, event: FillsCompared) -> None:
        for finding in uninit_findings(self, event):
            self.sink.emit(finding)

    def on_dma_address_compared(self, event: DmaAddressCompared) -> None:
        for finding in address_findings(self, event):
            self.sink.emit(finding)


def bbox(mask: np.ndarray) -> IndexRange:
    if mask.ndim == 0:
        return ()
    out = []
    for axis in range(mask.ndim):
        other = tuple(a for a in range(mask.ndim) if a != axis)
        hit = np.nonzero(mask.any(axis=other) if other else mask)[0]
        out.append((int(hit[0]), int(hit[-1]) + 1))
    return tuple(out)


def unwritten_finding(checker: Checker, event: OutputUnwritten) -> Finding:
    missing, name, kernel = event.unwritten, event.buffer, checker.call.kernel
    count = int(missing.sum())
    total = int(missing.size)
    rng = bbox(missing)
    return Finding(
        kind=FindingKind.UNWRITTEN_OUTPUT,
        message=f"{count} of {total} elements of output {name} are never written"
                f" (within {name}{format_range(rng)})",
        kernel=kernel, call_index=checker.call.call_index, grid_point=None, actor="",
        buffer=name, memory_space=MemorySpace.HBM, index_range=rng,
        frames=(SourceFrame(kernel.file, kernel.line, kernel.name,
                            code_line(kernel.file, kernel.line)),)
        if kernel.file else (),
        details={"elements": count, "total": total},
    )


def uninit_findings(checker: Checker, event: FillsCompared) -> list[Finding]:
    """Outputs that change with the fill of never-written memory depend on it (the lists
    run over every device's outputs; `names` names each)."""
    findings = []
    kernel, call_index = checker.call.kernel, checker.call.call_index
    written = event.written
    reads = distinct_reads(event.reads)
    for j, (a, b) in enumerate(zip(event.outputs, event.other)):
        differ = differs(a, b)
        if written[j] is not None:
            differ &= written[j]
        if not differ.any():
            continue
        name = event.names[j]
        count = int(differ.sum())
        rng = bbox(differ)
        first = reads[0]
        accesses = tuple(
            Access("read", r.actor, r.buffer, r.memory_space, r.index_range, r.frames,
                   r.grid_point)
            for r in reads[:8]
        )
        read_lines = ", ".join(
            f"{r.buffer}{format_range(r.index_range)}"
            + (f" at {r.frames[0].file}:{r.frames[0].line}" if r.frames else "")
            for r in reads[:3])
        notes = list(dict.fromkeys(r.note for r in reads[:3] if r.note))
        if notes:
            read_lines += " (" + "; ".join(notes) + ")"
        findings.append(Finding(
            kind=FindingKind.UNINITIALIZED,
            message=f"{count} elements of output {name}{format_range(rng)} depend on memory that"
                    f" was never written: read of {read_lines}",
            kernel=kernel, call_index=call_index, grid_point=first.grid_point,
            actor=first.actor, buffer=first.buffer, memory_space=first.memory_space,
            index_range=first.index_range, frames=first.frames, accesses=accesses,
            details={"output": name, "output_range": [list(r) for r in rng],
                     "elements": count},
        ))
    return findings


def address_findings(checker: Checker, event: DmaAddressCompared) -> list[Finding]:
    """The DMA the call stopped at (`event.dma`, a slice no part of its ref
    holds) addresses other elements when never-written memory holds the other fill
    (`other`: its ranges there, None when that run never reached it): the read of
    never-written memory that reached the address is the defect. Named: the latest read
    of SMEM before it (scalars are what addresses are made of), else the latest read."""
    dma, other = event.dma, event.other
    if other == dma.ranges:
        return []
    reads = distinct_reads(event.reads[:dma.reads])
    if not reads:
        return []
    scalar = [r for r in reads if r.memory_space == MemorySpace.SMEM] or reads
    read = scalar[-1]
    src, dst = dma.names
    where = (f"{dma.frames[0].file}:{dma.frames[0].line}" if dma.frames else "its kernel")
    read_at = f" at {read.frames[0].file}:{read.frames[0].line}" if read.frames else ""
    shown = (f"{src}{format_range(other[0])} -> {dst}{format_range(other[1])}"
             if other is not None else "none (the run takes another path before it)")
    dma_access = Access("dma-read", dma.actor, src, "", dma.ranges[0], dma.frames, dma.grid_point)
    return [Finding(
        kind=FindingKind.UNINITIALIZED,
        message=f"the DMA at {where} addresses {src}{format_range(dma.ranges[0])} ->"
                f" {dst}{format_range(dma.ranges[1])} with a size or index read from memory"
                f" that was never written: read of {read.buffer}"
                f"{format_range(read.index_range)}{read_at} (with never-written memory"
                f" holding other values the DMA addresses {shown})",
        kernel=checker.call.kernel, call_index=checker.call.call_index,
        grid_point=read.grid_point,
        actor=read.actor, buffer=read.buffer, memory_space=read.memory_space,
        index_range=read.index_range, frames=read.frames,
        accesses=(Access("read", read.actor, read.buffer, read.memory_space,
                         read.index_range, read.frames, read.grid_point), dma_access),
        details={"dma_source": [list(r) for r in dma.ranges[0]],
                 "dma_destination": [list(r) for r in dma.ranges[1]]},
    )]


def distinct_reads(reads: Sequence[UninitRead]) -> list[UninitRead]:
    seen: dict[tuple, UninitRead] = {}
    for r in reads:
        key = (r.buffer, r.frames[:1])
        if key not in seen:
            seen[key] = r
    return list(seen.values())
