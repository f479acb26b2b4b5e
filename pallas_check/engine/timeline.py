"""A timeline of one simulated call, recorded as plain data (`--trace`).

An observer: `CallState` (the hub every rule reports to) and the scheduler call it; it
never changes what the simulation does, and it prints nothing. Its clock is logical: one
tick per scheduler step and per recorded moment, so every moment has its own time and the
order is exactly the simulation's. The Chrome trace-event file is written from this data
by `report/trace.py`.

Tracks are the cores (`core 0`, per device) and the DMAs (`DMA #3`). Spans nest per track:
a core's grid steps hold its blocked waits; a DMA's lifetime holds its phases (queued ->
sending -> landed), from its start to the wait that accounts for it.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from pallas_check.findings import Finding


CALL_TRACK = "call"  # where a finding with no known actor is marked


@dataclasses.dataclass(frozen=True)
class Mark:
    """One moment on one track: a span's begin or end, an instant, or a flow's end."""

    kind: str  # "begin", "end", "instant", "flow-start", "flow-end"
    time: int
    step: int  # the scheduler step it happened in
    device: int
    track: str
    name: str = ""
    category: str = ""
    args: dict = dataclasses.field(default_factory=dict)
    flow: int = 0  # a flow's id (flow-start and flow-end share it)


@dataclasses.dataclass
class _Signal:
    time: int
    step: int
    device: int
    track: str
    what: str


class Timeline:
    """Records one schedule of one call (see the module docstring)."""

    def __init__(self, kernel: str, call_index: int, seed: int) -> None:
        self.kernel, self.call_index, self.seed = kernel, call_index, seed
        self.marks: list[Mark] = []
        self.findings: list[Finding] = []  # those marked, in order
        self.steps = 0
        self._clock = 0
        self._open: dict[tuple[int, str], list[str]] = {}  # track -> names of open spans
        self._actors: dict[str, tuple[int, str]] = {}  # actor name -> (device, track)
        self._signals: dict[tuple, list[_Signal]] = {}  # semaphore cell -> not yet waited
        self._dmas: dict[int, tuple[Any, int, int, tuple[int, str]]] = {}  # id -> start
        self._copies: dict[str, tuple[int, int, tuple[int, str]]] = {}  # pipeline copies
        self._flows = itertools.count(1)

    # -- the clock and the primitive marks ------------------------------------------------
    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _mark(self, kind: str, where: tuple[int, str], name: str = "", category: str = "",
              args: dict | None = None, time: int | None = None, step: int | None = None,
              flow: int = 0) -> Mark:
        mark = Mark(kind, self._tick() if time is None else time,
                    self.steps if step is None else step, where[0], where[1], name, category,
                    args or {}, flow)
        self.marks.append(mark)
        return mark

    def _begin(self, where: tuple[int, str], name: str, category: str,
               args: dict | None = None) -> None:
        self._open.setdefault(where, []).append(name)
        self._mark("begin", where, name, category, args)

    def _end(self, where: tuple[int, str], args: dict | None = None) -> None:
        stack = self._open.get(where)
        if stack:
            self._mark("end", where, stack.pop(), args=args)

    def _top(self, where: tuple[int, str]) -> str | None:
        stack = self._open.get(where)
        return stack[-1] if stack else None

    def _flow(self, name: str, source: tuple[int, int, tuple[int, str]],
              target: tuple[int, str]) -> None:
        """An arrow from a past moment (time, step, track) to now on `target`."""
        flow = next(self._flows)
        time, step, where = source
        self._mark("flow-start", where, name, "flow", time=time, step=step, flow=flow)
        self._mark("flow-end", target, name, "flow", flow=flow)

    # -- the scheduler --------------------------------------------------------------------
    def scheduled(self, actor: str) -> None:
        """The scheduler picked `actor` (one logical step)."""
        self.steps += 1
        self._tick()
        where = self._actors.get(actor)
        if where is not None and (self._top(where) or "").startswith("blocked"):
            self._end(where)

    def blocked(self, actor: str, wait: Any) -> None:
        """`actor` cannot go on until `wait` holds."""
        where = self._actors.get(actor)
        if where is None:
            return
        frame = wait.frames[0] if getattr(wait, "frames", None) else None
        self._begin(where, f"blocked: {wait.what} on {wait.semaphore}", "blocked",
                    {"semaphore": wait.semaphore, "wanted": wait.wanted,
                     "at": f"{frame.file}:{frame.line}" if frame else ""})

    # -- the hub (engine/call/state.py) --------------------------------------------------------
    def grid_step(self, ctx: Any, point: tuple[int, ...]) -> None:
        where = self._actors.setdefault(ctx.actor, (ctx.device_id, ctx.local_name))
        if self._top(where) is not None:
            self._end(where)  # the previous grid step
        self._begin(where, f"grid {point}", "grid-step", {"grid_point": list(point)})

    def core_done(self, ctx: Any) -> None:
        where = self._actors.get(ctx.actor)
        if where is not None:
            self._end(where)

    def dma_start(self, ctx: Any, dma: Any) -> None:
        here = self._actors.setdefault(ctx.actor, (ctx.device_id, ctx.local_name))
        track = (ctx.device_id, f"DMA #{dma.id}")
        self._actors[dma.actor_name] = track
        start = self._mark("instant", here, f"start DMA #{dma.id}", "dma",
                           {"src": dma.src.buffer.name, "dst": dma.dst.buffer.name})
        self._dmas[dma.id] = (dma, start.time, start.step, here)
        frame = dma.frames[0] if dma.frames else None
        self._begin(track, f"DMA #{dma.id} {dma.src.buffer.name} -> {dma.dst.buffer.name}",
                    "dma", {"bytes": dma.nbytes, "started_by": ctx.actor,
                            "at": f"{frame.file}:{frame.line}" if frame else "",
                            "to_device": dma.dst.buffer.device})
        self._begin(track, "queued", "dma-phase")

    def dma_read(self, dma: Any, cells: list[tuple]) -> None:
        """The DMA read its source (its send side) and signalled `cells` (its send
        semaphore)."""
        track = self._actors.get(dma.actor_name)
        if track is not None and self._top(track) == "queued":
            self._end(track)
            for cell in cells:
                self._signalled(cell, track, f"DMA #{dma.id} sent")
            self._begin(track, "sending", "dma-phase")

    def dma_landed(self, dma: Any, cells: list[tuple]) -> None:
        """The DMA wrote its destination (its receive side) and signalled `cells`."""
        track = self._actors.get(dma.actor_name)
        started = self._dmas.get(dma.id)
        if track is None or started is None:
            return
        self._end(track)  # sending
        self._flow("DMA start -> landing", (started[1], started[2], started[3]), track)
        for cell in cells:
            self._signalled(cell, track, f"DMA #{dma.id} landed")
        self._begin(track, "landed, not yet waited", "dma-phase")

    def copy_started(self, ctx: Any, name: str, buffer: str) -> None:
        """A BlockSpec pipeline copy started: a lifetime slice on the track of the VMEM
        buffer it fills or drains (`pipeline x_ref buffer 1`, one per double buffer)."""
        here = self._actors.setdefault(ctx.actor, (ctx.device_id, ctx.local_name))
        track = (ctx.device_id, f"pipeline {buffer}" + (f" (core {ctx.core_id})"
                                                         if ctx.core_id else ""))
        self._actors[name] = track
        start = self._mark("instant", here, f"start {name}", "dma")
        self._copies[name] = (start.time, start.step, here)
        self._begin(track, name, "dma", {"started_by": ctx.actor})
        self._begin(track, "queued", "dma-phase")

    def copy_moved(self, name: str) -> None:
        """The copy read HBM (a copy-in) or wrote it (a write-back)."""
        track = self._actors.get(name)
        started = self._copies.get(name)
        if track is None or started is None or self._top(track) != "queued":
            return
        self._end(track)
        self._flow("DMA start -> landing", started, track)
        self._begin(track, "landed, not yet waited", "dma-phase")

    def copy_waited(self, ctx: Any, name: str) -> None:
        track = self._actors.get(name)
        if track is None or self._copies.pop(name, None) is None:
            return
        self._end(track)
        self._end(track, {"waited_by": ctx.actor})

    def signal(self, ctx: Any, cell: tuple) -> None:
        where = self._actors.setdefault(ctx.actor, (ctx.device_id, ctx.local_name))
        self._mark("instant", where, f"signal {_cell_name(cell)}", "semaphore")
        self._signalled(cell, where, f"signal by {ctx.actor}")

    def _signalled(self, cell: tuple, where: tuple[int, str], what: str) -> None:
        self._signals.setdefault(_cell_key(cell), []).append(
            _Signal(self._clock, self.steps, where[0], where[1], what))

    def waited(self, ctx: Any, cell: tuple, what: str) -> None:
        """A wait on `cell` completed: arrows from the signals it consumed; the DMAs it
        accounted for in full end."""
        where = self._actors.setdefault(ctx.actor, (ctx.device_id, ctx.local_name))
        self._mark("instant", where, f"{what} {_cell_name(cell)} done", "semaphore")
        for signal in self._signals.pop(_cell_key(cell), []):
            self._flow("signal -> wait", (signal.time, signal.step,
                                          (signal.device, signal.track)), where)
        for dma_id, (dma, *_rest) in list(self._dmas.items()):
            if _cell_key(dma.dst_sem) == _cell_key(cell) and dma.waited_bytes >= dma.signal:
                track = self._actors[dma.actor_name]
                if self._top(track) == "landed, not yet waited":
                    self._end(track)
                    self._end(track, {"waited_by": ctx.actor})
                    del self._dmas[dma_id]

    def finding(self, finding: Finding) -> None:
        """An instant where the finding was found, on its actor's track."""
        actors = [finding.actor, *(a.actor for a in finding.accesses)]
        where = next((self._actors[a] for a in actors if a in self._actors), (0, CALL_TRACK))
        self.findings.append(finding)
        self._mark("instant", where, f"{finding.kind.value}: {finding.buffer}", "finding",
                   {"kind": finding.kind.value, "message": finding.message,
                    "grid_point": (None if finding.grid_point is None
                                   else list(finding.grid_point)),
                    "actor": finding.actor, "finding": id(finding)})

    # -- the result -----------------------------------------------------------------------
    def snapshot(self) -> list[Mark]:
        """Every mark in time order, spans still open (a deadlock's blocked actors, DMAs
        never waited) ended after the last moment, innermost first."""
        closing = Timeline(self.kernel, self.call_index, self.seed)
        closing._clock, closing.steps = self._clock, self.steps
        for where, stack in sorted(self._open.items()):
            for name in reversed(stack):
                closing._mark("end", where, name, args={"unfinished": True})
        return sorted(self.marks + closing.marks, key=lambda m: m.time)


def _cell_key(cell: tuple) -> tuple:
    buf, idx = cell
    return (buf.id, tuple(int(i) for i in idx))


def _cell_name(cell: tuple) -> str:
    buf, idx = cell
    return buf.name + ("[" + ", ".join(str(int(i)) for i in idx) + "]" if len(idx) else "")
