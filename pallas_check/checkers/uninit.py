"""Uninitialized memory: reads of never-written elements, and whether they reached an
output (the call is re-run with another fill and the outputs compared); output elements
the kernel never wrote."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from pallas_check.findings import (
    Access, Finding, FindingKind, IndexRange, KernelInfo, SourceFrame, format_range)
from pallas_check.engine.events import UninitRead
from pallas_check.engine.memory.buffer import Buffer, MemorySpace
from pallas_check.sourceinfo import code_line

if TYPE_CHECKING:  # only for annotations
    from pallas_check.engine.call.state import CallState


def bbox(mask: np.ndarray) -> IndexRange:
    if mask.ndim == 0:
        return ()
    out = []
    for axis in range(mask.ndim):
        other = tuple(a for a in range(mask.ndim) if a != axis)
        hit = np.nonzero(mask.any(axis=other) if other else mask)[0]
        out.append((int(hit[0]), int(hit[-1]) + 1))
    return tuple(out)


def unwritten_finding(state: CallState, buf: Buffer) -> None:
    missing = ~buf.written
    count = int(missing.sum())
    total = int(missing.size)
    rng = bbox(missing)
    state.add(Finding(
        kind=FindingKind.UNWRITTEN_OUTPUT,
        message=f"{count} of {total} elements of output {buf.name} are never written"
                f" (within {buf.name}{format_range(rng)})",
        kernel=state.kernel, call_index=state.call_index, grid_point=None, actor="",
        buffer=buf.name, memory_space=MemorySpace.HBM, index_range=rng,
        frames=(SourceFrame(state.kernel.file, state.kernel.line, state.kernel.name,
                            code_line(state.kernel.file, state.kernel.line)),)
        if state.kernel.file else (),
        details={"elements": count, "total": total},
    ))


def uninit_findings(output_names: list[str], state: CallState, outputs: list[np.ndarray],
                    other: list[np.ndarray], written: list[np.ndarray | None],
                    kernel: KernelInfo, call_index: int) -> list[Finding]:
    """Outputs that change with the fill of never-written memory depend on it (the lists
    run over every device's outputs; `output_names` names each)."""
    findings = []
    reads = distinct_reads(state.uninit_reads)
    for j, (a, b) in enumerate(zip(outputs, other)):
        differ = differs(a, b)
        if written[j] is not None:
            differ &= written[j]
        if not differ.any():
            continue
        name = output_names[j]
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


def address_findings(state: CallState,
                     other: tuple[IndexRange, IndexRange] | None) -> list[Finding]:
    """The DMA the call stopped at (`state.unbounded_dma`, a slice no part of its ref
    holds) addresses other elements when never-written memory holds the other fill
    (`other`: its ranges there, None when that run never reached it): the read of
    never-written memory that reached the address is the defect. Named: the latest read
    of SMEM before it (scalars are what addresses are made of), else the latest read."""
    dma = state.unbounded_dma
    if dma is None or other == dma.ranges:
        return []
    reads = distinct_reads(state.uninit_reads[:dma.reads])
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
        kernel=state.kernel, call_index=state.call_index, grid_point=read.grid_point,
        actor=read.actor, buffer=read.buffer, memory_space=read.memory_space,
        index_range=read.index_range, frames=read.frames,
        accesses=(Access("read", read.actor, read.buffer, read.memory_space,
                         read.index_range, read.frames, read.grid_point), dma_access),
        details={"dma_source": [list(r) for r in dma.ranges[0]],
                 "dma_destination": [list(r) for r in dma.ranges[1]]},
    )]


def distinct_reads(reads: list[UninitRead]) -> list[UninitRead]:
    seen: dict[tuple, UninitRead] = {}
    for r in reads:
        key = (r.buffer, r.frames[:1])
        if key not in seen:
            seen[key] = r
    return list(seen.values())


def differs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "fc" or "float" in a.dtype.name:
        af, bf = a.astype(np.float64), b.astype(np.float64)
        both_nan = np.isnan(af) & np.isnan(bf)
        return ~((af == bf) | both_nan)
    return a != b
