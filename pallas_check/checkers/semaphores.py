"""Semaphores left with a non-zero count at kernel end, with where they were last signalled
(counts explained by a DMA never waited are reported as that DMA instead)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Sequence

from pallas_check.checkers.base import Checker
from pallas_check.engine.events import CallEnded, DmaNotWaited, SemaphoreLeft
from pallas_check.engine.rules.sparsecore import SignalNotRemote  # declared where it is built
from pallas_check.engine.memory.buffer import MemorySpace
from pallas_check.findings.finding import Finding, FindingKind, SourceFrame, format_range

if TYPE_CHECKING:  # what a call returned; the checkers see it only at the script's end
    from pallas_check.engine.call.carried import SemaphoreValue


class SemaphoreChecker(Checker):
    def on_call_ended(self, event: CallEnded) -> None:
        for left in event.semaphores:
            finding = leak_finding(self, event, left)
            if finding is not None:
                self.sink.emit(finding)

    def on_dma_not_waited(self, event: DmaNotWaited) -> None:
        self.sink.emit(dma_not_waited_finding(self, event))

    def on_signal_not_remote(self, event: SignalNotRemote) -> None:
        self.sink.emit(signal_not_remote_finding(self, event))


def leak_finding(checker: Checker, end: CallEnded, left: SemaphoreLeft) -> Finding | None:
    """A semaphore cell left with a count, unless DMAs never waited explain it (those are
    reported as such)."""
    if left.count - left.unwaited == 0:
        return None
    frames, signaller = left.last_signal, left.last_signaller
    # Several devices: say whose semaphore leaked and who signalled it last (a remote
    # signal's target is another device than its signaller).
    on = f" of device {left.device}" if end.num_devices > 1 else ""
    by = f" by {signaller}" if signaller and end.num_devices > 1 else ""
    where = f", last signalled{by} at {frames[0].file}:{frames[0].line}" if frames else ""
    return Finding(
        kind=FindingKind.SEMAPHORE_LEAK,
        message=f"semaphore {left.cell}{on} ends the kernel with count {left.count}{where}",
        kernel=checker.call.kernel, call_index=checker.call.call_index, grid_point=None,
        actor=signaller or end.actor, buffer=left.buffer, memory_space=MemorySpace.SEMAPHORE,
        index_range=tuple((i, i + 1) for i in left.index) or None, frames=frames,
        details={"count": left.count, "semaphore": left.cell},
        help=leak_help(left.cell, left.count - left.unwaited, frames),
    )


def leak_help(cell: str, count: int, frames: tuple[SourceFrame, ...]) -> str | None:
    """The signal without a matching wait, and the wait that would match it (the
    signal's own ref where the signal names nothing else, else the cell)."""
    if not frames:
        return None
    code = frames[0].code.strip()
    simple = re.fullmatch(r"(.*?)semaphore_signal\(([\w.\[\]]+)\)", code)
    amount = f", {count}" if count != 1 else ""
    wait = (f"{simple.group(1)}semaphore_wait({simple.group(2)}{amount})" if simple
            else f"pl.semaphore_wait({cell}{amount})")
    shown = f" (`{code}`)" if code else ""
    left = f" ({count} counts left)" if count != 1 else ""
    return (f"the signal at {frames[0].file}:{frames[0].line}{shown} has no matching"
            f" wait{left}: add `{wait}` before the kernel returns, on the core and device"
            f" that own {cell}, or drop the signal")


def signal_not_remote_finding(checker: Checker, event: SignalNotRemote) -> Finding:
    """A signal meant for another subcore of a SparseCore that goes to the signaller's own
    semaphore (Mosaic: `tpu.sem_signal` with no core or subcore operand)."""
    semaphore, where = event.semaphore, event.where
    return Finding(
        kind=FindingKind.SIGNAL_NOT_REMOTE,
        message=(f"pl.semaphore_signal({semaphore}, device_id={event.named}) by {where.actor}"
                 f" signals its OWN {semaphore}: in a SparseCore vector-subcore kernel Mosaic"
                 f" drops the core and subcore of device_id for an ordinary semaphore (a"
                 f" local tpu.sem_signal), so the subcore named is never signalled and a wait"
                 f" for it there hangs on the chip"),
        kernel=checker.call.kernel, call_index=checker.call.call_index,
        grid_point=where.grid_point, actor=where.actor, buffer=semaphore,
        memory_space=MemorySpace.SEMAPHORE, index_range=None, frames=where.frames,
        details={"device_id": event.named},
    )


def not_waited_help(dma: DmaNotWaited) -> str | None:
    """The wait a DMA never waited on needs: its descriptor's, before the kernel returns."""
    if not dma.frames:
        return None
    started = dma.frames[0].code.strip()
    wait = (f"`{started[:-len('.start()')]}.wait()`" if started.endswith(".start()")
            else "`.wait()` on its descriptor")
    return (f"call {wait} for the DMA started at {dma.frames[0].file}:{dma.frames[0].line}"
            f" before {dma.dst} is used and before the kernel returns")


def dma_not_waited_finding(checker: Checker, dma: DmaNotWaited) -> Finding:
    """A DMA whose bytes were never (fully) taken off its semaphore by a wait."""
    help = None
    sem, count = dma.semaphore, dma.semaphore_count
    what = (f"DMA #{dma.id} {dma.src}{format_range(dma.src_range)}"
            f" -> {dma.dst}{format_range(dma.dst_range)}")
    if dma.signal not in (-1, dma.nbytes):  # a regular semaphore's count
        message = (f"{what} ({dma.nbytes} bytes) added {dma.signal} to regular semaphore"
                   f" {sem}, and waits took {dma.waited_bytes} of it: semaphore {sem} ends"
                   f" the kernel with count {count}")
        help = (f"a DMA adds its byte count / 32 ({dma.signal} here) to a REGULAR semaphore"
                f" on a TPU v5e, not one (measured on the chip; one per DMA is v6e+):"
                f" wait with the DMA's own descriptor (`.wait()`) or"
                f" `pl.semaphore_wait({sem}, {dma.signal})`, or signal a DMA semaphore"
                if dma.signal > 1 else None)
    elif dma.waited_bytes:
        message = (f"{what} ({dma.nbytes} bytes) was waited for only {dma.waited_bytes}"
                   f" of its bytes: {dma.nbytes - dma.waited_bytes} bytes were never"
                   f" waited, and semaphore {sem} ends the kernel with count {count} (a"
                   f" wait takes the size of the descriptor it is given: waiting with"
                   f" another DMA's descriptor of another size leaves bytes behind)")
    elif dma.origin is not None:  # carried in from the call that started it
        message = (f"{what} was started in call #{dma.origin[0]} ({dma.origin[1]})"
                   f" and never waited on: semaphore {sem}, which carried it into this"
                   f" call, ends here (its last holder) with count {count}")
    else:
        message = (f"{what} was started but never waited on (semaphore {sem}, which"
                   f" ends the kernel with count {count})")
        help = not_waited_help(dma)
    return Finding(
        kind=FindingKind.DMA_NOT_WAITED,
        message=message,
        kernel=checker.call.kernel, call_index=checker.call.call_index,
        grid_point=dma.grid_point, actor=dma.actor, buffer=dma.dst,
        memory_space=dma.dst_space, index_range=dma.dst_range, frames=dma.frames,
        details={"semaphore": sem, "bytes": dma.nbytes,
                 "waited_bytes": dma.waited_bytes, "semaphore_count": count},
        help=help,
    )


def never_taken_findings(values: Sequence[SemaphoreValue]) -> list[Finding]:
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
