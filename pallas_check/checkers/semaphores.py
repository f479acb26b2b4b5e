"""Semaphores left with a non-zero count at kernel end, with where they were last signalled
(counts explained by a DMA never waited are reported as that DMA instead)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from pallas_check.findings import Finding, FindingKind, format_range
from pallas_check.engine.memory.buffer import MemorySpace
from pallas_check.engine.dma.engine import sem_name, sem_value

if TYPE_CHECKING:  # only for annotations
    from pallas_check.engine.call.state import CallState, CoreContext


def semaphore_findings(state: CallState, ctx: CoreContext) -> None:
    unwaited: dict[tuple[int, tuple], int] = {}
    for dma in state.sync.dmas:
        key = (dma.dst_sem[0].id, dma.dst_sem[1])
        unwaited[key] = unwaited.get(key, 0) + dma.signal - dma.waited_bytes
    for buf in state.semaphores:
        for idx in zip(*np.nonzero(buf.data)) if buf.data.ndim else [()]:
            idx = tuple(int(i) for i in idx)
            count = int(buf.data[idx])
            if count == 0:
                continue
            left = count - unwaited.get((buf.id, idx), 0)
            if left == 0:
                continue  # explained by a DMA never waited, reported as such
            frames = state.sync.last_signal.get((buf.id, idx), ())
            signaller = state.sync.last_signaller.get((buf.id, idx), "")
            cell = sem_name((buf, idx))
            # Several devices: say whose semaphore leaked and who signalled it last (a
            # remote signal's target is another device than its signaller).
            on = f" of device {buf.device}" if state.mesh.num_devices > 1 else ""
            by = f" by {signaller}" if signaller and state.mesh.num_devices > 1 else ""
            where = (f", last signalled{by} at {frames[0].file}:{frames[0].line}"
                     if frames else "")
            state.add(Finding(
                kind=FindingKind.SEMAPHORE_LEAK,
                message=f"semaphore {cell}{on} ends the kernel with count {count}{where}",
                kernel=state.kernel, call_index=state.call_index, grid_point=None,
                actor=signaller or ctx.actor, buffer=buf.name, memory_space=MemorySpace.SEMAPHORE,
                index_range=tuple((i, i + 1) for i in idx) or None, frames=frames,
                details={"count": count, "semaphore": cell},
            ))


def signal_not_remote_finding(state: CallState, ctx: CoreContext, semaphore: str, named: str,
                              signaller: str, frames: tuple) -> Finding:
    """A signal meant for another subcore of a SparseCore that goes to the signaller's own
    semaphore (Mosaic: `tpu.sem_signal` with no core or subcore operand)."""
    return Finding(
        kind=FindingKind.SIGNAL_NOT_REMOTE,
        message=(f"pl.semaphore_signal({semaphore}, device_id={named}) by {signaller} signals"
                 f" its OWN {semaphore}: in a SparseCore vector-subcore kernel Mosaic drops"
                 f" the core and subcore of device_id for an ordinary semaphore (a local"
                 f" tpu.sem_signal), so the subcore named is never signalled and a wait for"
                 f" it there hangs on the chip"),
        kernel=state.kernel, call_index=state.call_index, grid_point=ctx.grid_point,
        actor=signaller, buffer=semaphore, memory_space=MemorySpace.SEMAPHORE,
        index_range=None, frames=frames, details={"device_id": named},
    )


def dma_not_waited_findings(state: CallState) -> list[Finding]:
    """Every DMA whose bytes were never (fully) taken off its semaphore by a wait."""
    findings = []
    for dma in state.sync.dmas:
        if dma.waited_bytes >= dma.signal:
            continue
        sem = sem_name(dma.dst_sem)
        count = sem_value(dma.dst_sem)
        what = (f"DMA #{dma.id} {dma.src.buffer.name}{format_range(dma.src.index_range())}"
                f" -> {dma.dst.buffer.name}{format_range(dma.dst.index_range())}")
        if dma.waited_bytes:
            message = (f"{what} ({dma.nbytes} bytes) was waited for only {dma.waited_bytes}"
                       f" of its bytes: {dma.nbytes - dma.waited_bytes} bytes were never"
                       f" waited, and semaphore {sem} ends the kernel with count {count} (a"
                       f" wait takes the size of the descriptor it is given: waiting with"
                       f" another DMA's descriptor of another size leaves bytes behind)")
        elif dma.origin is not None:  # carried in from the call that started it
            message = (f"{what} was started in call #{dma.origin[0]} ({dma.origin[1].name})"
                       f" and never waited on: semaphore {sem}, which carried it into this"
                       f" call, ends here (its last holder) with count {count}")
        else:
            message = (f"{what} was started but never waited on (semaphore {sem}, which"
                       f" ends the kernel with count {count})")
        findings.append(Finding(
            kind=FindingKind.DMA_NOT_WAITED,
            message=message,
            kernel=state.kernel, call_index=state.call_index, grid_point=dma.grid_point,
            actor=dma.actor, buffer=dma.dst.buffer.name, memory_space=dma.dst.buffer.space,
            index_range=dma.dst.index_range(), frames=dma.frames,
            details={"semaphore": sem, "bytes": dma.nbytes,
                     "waited_bytes": dma.waited_bytes, "semaphore_count": count},
        ))
    return findings


def never_taken_findings(values: list) -> list[Finding]:
    """Semaphores a call returned that no later call took, at the end of the script
    (engine/call/carried.py's SemaphoreValue): each DMA they carry that was never waited, and
    a count its DMAs do not explain, reported at the call that returned them."""
    findings = []
    for value in values:
        unwaited = 0
        for dma in value.dmas:
            if not dma.lands or dma.waited_bytes >= dma.signal:
                continue
            unwaited += dma.signal - dma.waited_bytes
            src_name, src_range, *_ = dma.src
            dst_name, dst_range, *_ = dma.dst
            findings.append(Finding(
                kind=FindingKind.DMA_NOT_WAITED,
                message=(f"DMA {src_name}{format_range(src_range)} ->"
                         f" {dst_name}{format_range(dst_range)} was started in"
                         f" {dma.origin} and never waited on: semaphore {value.name},"
                         f" returned by call #{value.call_index} ({value.kernel.name}),"
                         " is taken by no later call before the script ends"),
                kernel=dma.kernel, call_index=dma.call_index, grid_point=dma.grid_point,
                actor=dma.starter, buffer=dst_name, memory_space=MemorySpace.HBM,
                index_range=dst_range, frames=dma.frames,
                details={"semaphore": value.name, "bytes": dma.nbytes,
                         "waited_bytes": dma.waited_bytes,
                         "started_in_call": dma.call_index}))
        # What the count comes to once every DMA it carries has signalled it.
        count = value.count + sum(d.signal for d in value.dmas if not d.landed_already)
        if count - unwaited:
            findings.append(Finding(
                kind=FindingKind.SEMAPHORE_LEAK,
                message=(f"semaphore {value.name}, returned by call #{value.call_index}"
                         f" ({value.kernel.name}), is taken by no later call before the"
                         f" script ends, and is left with count {count - unwaited}"),
                kernel=value.kernel, call_index=value.call_index, grid_point=None,
                # Where it was last signalled, or the start of a DMA that signals it.
                actor=value.last_signaller, frames=value.last_signal or next(
                    (d.frames for d in value.dmas), ()),
                buffer=value.name.split("[")[0], memory_space=MemorySpace.SEMAPHORE,
                details={"count": count, "semaphore": value.name}))
    return findings
