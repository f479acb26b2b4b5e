"""How to fix a race (issue 36: a finding says how to fix it, as rustc and ruff do).

The race checker knows the two unordered accesses; which order a TPU promises decides the
fix. A DMA's write and a core's access to its destination are ordered only by the DMA's
wait (`wait_recv`); a DMA's read of its source and a later write of that source only by
`wait_send`; two DMAs into one place by one's wait before the other's start; two cores by a
semaphore or a barrier. Pure text, made from the two accesses the finding names.
"""

from __future__ import annotations

import re

from pallas_check.findings.finding import Access, SourceFrame

_DMA_ACTOR = re.compile(r"DMA #(\d+)")


def _dma_id(actor: str) -> str | None:
    match = _DMA_ACTOR.match(actor)
    return match.group(1) if match else None


def _line(frames: tuple[SourceFrame, ...]) -> str:
    return f"line {frames[0].line}" if frames else "its line"


def race_help(current: Access, previous: Access) -> str | None:
    """One sentence: what orders these two accesses on a TPU, and where to put it (None
    where a BlockSpec pipeline's copy is one of them: its order is the pipeline's, and
    the fix depends on what the kernel meant)."""
    if any(a.actor.startswith("pipeline ") for a in (current, previous)):
        return None
    buffer = current.buffer
    first, second = _dma_id(current.actor), _dma_id(previous.actor)
    if first and second:
        return (f"DMA #{first} and DMA #{second} are in flight on {buffer} at once: wait for"
                f" one (`.wait()` on its descriptor) before starting the other, or give them"
                f" different slots")
    if not first and not second:
        return (f"order {current.actor}'s {current.operation} ({_line(current.frames)}) and"
                f" {previous.actor}'s {previous.operation} ({_line(previous.frames)}) of"
                f" {buffer}: a semaphore signal and wait, or a barrier, between them")
    dma, core = (current, previous) if first else (previous, current)
    number = first or second
    if dma.operation != "DMA read":
        return (f"wait for DMA #{number} (`.wait()` on its descriptor) before the"
                f" {core.operation} of {buffer} at {_line(core.frames)}, or"
                f" {'read' if core.operation == 'read' else 'use'} the other slot (a buffer"
                f" no DMA in flight is filling)")
    return (f"DMA #{number} still reads {buffer}: wait for it (`.wait()`, or `wait_send` for a"
            f" remote copy) before the {core.operation} of {buffer} at {_line(core.frames)},"
            f" or write another slot")
