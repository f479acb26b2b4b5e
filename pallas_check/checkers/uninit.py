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
from pallas_check.findings.finding import (
    Access, Finding, FindingKind, IndexRange, SourceFrame, format_range)
from pallas_check.findings.sourceinfo import code_line
from pallas_check.findings.units import plural


class UninitChecker(Checker):
    def on_output_unwritten(self, event: OutputUnwritten) -> None:
        if event.clobbered:
            self.sink.emit(clobbered_finding(self, event))
            return
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
        message=f"{count} of {plural(total, 'element')} of output {name}"
                f" {'is' if count == 1 else 'are'} never written"
                f" (within {name}{format_range(rng)})",
        kernel=kernel, call_index=checker.call.call_index, grid_point=None, actor="",
        buffer=name, memory_space=MemorySpace.HBM, index_range=rng,
        frames=(SourceFrame(kernel.file, kernel.line, kernel.name,
                            code_line(kernel.file, kernel.line)),)
        if kernel.file else (),
        details={"elements": count, "total": total},
        help=unwritten_help(event),
    )


def unwritten_help(event: OutputUnwritten) -> str | None:
    """The blocks of a blocked output no grid point visits; or, every block visited,
    that the kernel leaves part of them unwritten. None: not a blocked output."""
    name, shape = event.buffer, event.block_shape
    if shape is None:
        return None
    if not event.unvisited_count:
        return (f"every block of {name} is visited by some grid point, but the kernel does"
                f" not write all of it: write the whole {list(shape)} block at every grid"
                f" step that visits it (or alias {name} to an input whose values it keeps)")
    n = event.unvisited_count
    shown = ", ".join(str(b) for b in event.unvisited)
    more = f" and {n - len(event.unvisited)} more" if n > len(event.unvisited) else ""
    blocks = "block" if n == 1 else "blocks"
    return (f"no grid point visits {blocks} {shown}{more} of {name} (blocks of"
            f" {list(shape)}): make the grid and the out_specs index map cover every block"
            f" of {name}")


def clobbered_finding(checker: Checker, event: OutputUnwritten) -> Finding:
    """Elements of an output aliased to an input that a write-back overwrote with memory
    the kernel never wrote: on a TPU an output block is never read in from HBM, so a block
    the grid visits is written back whole, and what the kernel left unwritten replaces
    the input's values there (the kernel relied on the alias to keep them)."""
    finding = unwritten_finding(checker, event)
    name, rng = event.buffer, finding.index_range
    finding.message = (
        f"{finding.details['elements']} of {finding.details['total']} elements of output"
        f" {name}, aliased to an input, are overwritten with memory the kernel never wrote"
        f" (within {name}{format_range(rng)}): an output block is not read in, so a block"
        " visited without writing these elements is written back whole over the input's"
        " values")
    finding.details["clobbered"] = True
    return finding


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
        early = next((r for r in reads if r.dma is not None), None)
        if early is not None:  # the memory is a DMA's destination, read before its wait
            notes.append(unlanded_note(early))
        if notes:
            read_lines += " (" + "; ".join(notes) + ")"
        findings.append(Finding(
            kind=FindingKind.UNINITIALIZED,
            message=f"{plural(count, 'element')} of output {name}{format_range(rng)}"
                    f" {'depends' if count == 1 else 'depend'} on memory that was never"
                    f" written: read of {read_lines}",
            kernel=kernel, call_index=call_index, grid_point=first.grid_point,
            actor=first.actor, buffer=first.buffer, memory_space=first.memory_space,
            index_range=first.index_range, frames=first.frames, accesses=accesses,
            details={"output": name, "output_range": [list(r) for r in rng],
                     "elements": count},
            help=None if early is None else unlanded_help(early),
        ))
    return findings


def _at(frames: tuple[SourceFrame, ...], near: tuple[SourceFrame, ...] = ()) -> str:
    """`file:line`, or `line N` in the file of `near`'s first frame."""
    if not frames:
        return "its kernel"
    if near and near[0].file == frames[0].file:
        return f"line {frames[0].line}"
    return f"{frames[0].file}:{frames[0].line}"


def unlanded_note(read: UninitRead) -> str:
    """The message's word on a read that came before the DMA filling its memory landed:
    that DMA, and its wait that came too late (or never)."""
    dma = read.dma
    assert dma is not None
    waited = (f"waited at {_at(dma.wait, dma.frames)}, after the read" if dma.wait
              else "never waited")
    return (f"the read comes before the wait of DMA #{dma.id}, which fills {read.buffer}:"
            f" started at {_at(dma.frames)} and {waited}")


def unlanded_help(read: UninitRead) -> str:
    """How to fix a read before a DMA's wait: the wait to move (or add), the read."""
    dma = read.dma
    assert dma is not None
    started = dma.frames[0].code.strip() if dma.frames and dma.frames[0].code else ""
    descriptor = started[:-len(".start()")] if started.endswith(".start()") else ""
    if dma.wait:
        code = dma.wait[0].code.strip() if dma.wait[0].code else ""
        wait = (f"move its wait ({f'`{code}`, ' if code else ''}{_at(dma.wait, dma.frames)})"
                " before")
    else:
        wait = (f"call `{descriptor}.wait()`" if descriptor
                else "wait for it (`.wait()` on its descriptor)") + " before"
    return (f"DMA #{dma.id} (started at {_at(dma.frames)}) fills {read.buffer}: {wait} the"
            f" read of {read.buffer} at {_at(read.frames, dma.frames)}, or read the other slot"
            f" (a buffer no DMA in flight is filling)")


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
    seen: dict[tuple[str, tuple[SourceFrame, ...]], UninitRead] = {}
    for r in reads:
        key = (r.buffer, r.frames[:1])
        if key not in seen:
            seen[key] = r
    return list(seen.values())
