"""A timeline of one simulated call, recorded as plain data (`--trace`).

A listener of the engine's events (engine/events.py) and the scheduler's observer; it
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

from pallas_check.engine.events import (ActorsDeclared, Cell, CopyMoved, CopyStarted,
                                        CopyWaited, CoreDone, DmaMoved, DmaStarted, Found,
                                        GridStep, Listener, Signalled, Waited)
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


class Timeline(Listener):
    """Records one schedule of one call (see the module docstring): a listener of the
    engine's events, and the scheduler's observer."""

    def __init__(self, kernel: str, call_index: int, seed: int) -> None:
        self.kernel, self.call_index, self.seed = kernel, call_index, seed
        self.marks: list[Mark] = []
        self.findings: list[Finding] = []  # those marked, in order
        self.steps = 0
        self._clock = 0
        self._open: dict[tuple[int, str], list[str]] = {}  # track -> names of open spans
        self._actors: dict[str, tuple[int, str]] = {}  # actor name -> (device, track)
        self._tracks: dict[tuple[int, int], str] = {}  # (device, core) -> its core's track
        self._signals: dict[tuple, list[_Signal]] = {}  # semaphore cell -> not yet waited
        # DMA id -> its receive semaphore, its actor, and its start (time, step, track)
        self._dmas: dict[int, tuple[tuple, str, int, int, tuple[int, str]]] = {}
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

    # -- the engine's events (engine/events.py) -----------------------------------------
    def on_actors_declared(self, event: ActorsDeclared) -> None:
        self._tracks = {(device, core): name for device, core, name in event.tracks}

    def _core(self, actor: str, device: int, core: int) -> tuple[int, str]:
        """The track of a core (a SparseCore subcore's: `sparsecore 1 subcore 7`), where
        a parallel_loop iteration of it acts too."""
        where = self._actors.get(actor)
        if where is None:
            where = self._actors[actor] = (device, self._tracks.get((device, core))
                                           or f"core {core}")
        return where

    def on_grid_step(self, event: GridStep) -> None:
        where = self._core(event.actor, event.device, event.core)
        if self._top(where) is not None:
            self._end(where)  # the previous grid step
        self._begin(where, f"grid {event.point}", "grid-step",
                    {"grid_point": list(event.point)})

    def on_core_done(self, event: CoreDone) -> None:
        where = self._actors.get(event.actor)
        if where is not None:
            self._end(where)

    def on_dma_started(self, event: DmaStarted) -> None:
        here = self._core(event.starter, event.device, event.core)
        track = (event.device, f"DMA #{event.id}")
        self._actors[event.actor] = track
        start = self._mark("instant", here, f"start DMA #{event.id}", "dma",
                           {"src": event.src, "dst": event.dst})
        self._dmas[event.id] = (event.dst_cell.key, event.actor, start.time, start.step, here)
        frame = event.frames[0] if event.frames else None
        self._begin(track, f"DMA #{event.id} {event.src} -> {event.dst}",
                    "dma", {"bytes": event.nbytes, "started_by": event.starter,
                            "at": f"{frame.file}:{frame.line}" if frame else "",
                            "to_device": event.to_device})
        self._begin(track, "queued", "dma-phase")
        if event.carried and event.read_done:  # carried in, already past its read
            self._dma_read(event.id, event.actor, ())

    def on_dma_moved(self, event: DmaMoved) -> None:
        if event.replayed:  # (landed in an earlier call: its track says so already)
            return
        cells = (event.signalled,) if event.signalled is not None else ()
        if event.landed:
            self._dma_landed(event.id, event.actor, cells)
        else:
            self._dma_read(event.id, event.actor, cells)

    def _dma_read(self, dma_id: int, actor: str, cells: tuple[Cell, ...]) -> None:
        """The DMA read its source (its send side) and signalled `cells` (its send
        semaphore)."""
        track = self._actors.get(actor)
        if track is not None and self._top(track) == "queued":
            self._end(track)
            for cell in cells:
                self._signalled(cell, track, f"DMA #{dma_id} sent")
            self._begin(track, "sending", "dma-phase")

    def _dma_landed(self, dma_id: int, actor: str, cells: tuple[Cell, ...]) -> None:
        """The DMA wrote its destination (its receive side) and signalled `cells`."""
        track = self._actors.get(actor)
        started = self._dmas.get(dma_id)
        if track is None or started is None:
            return
        self._end(track)  # sending
        self._flow("DMA start -> landing", (started[2], started[3], started[4]), track)
        for cell in cells:
            self._signalled(cell, track, f"DMA #{dma_id} landed")
        self._begin(track, "landed, not yet waited", "dma-phase")

    def on_copy_started(self, event: CopyStarted) -> None:
        """A BlockSpec pipeline copy started: a lifetime slice on the track of the VMEM
        buffer it fills or drains (`pipeline x_ref buffer 1`, one per double buffer)."""
        here = self._core(event.actor, event.device, event.core)
        track = (event.device, f"pipeline {event.operand} buffer {event.buffer}"
                 + (f" (core {event.core})" if event.core else ""))
        name = event.name
        self._actors[name] = track
        start = self._mark("instant", here, f"start {name}", "dma")
        self._copies[name] = (start.time, start.step, here)
        self._begin(track, name, "dma", {"started_by": event.actor})
        self._begin(track, "queued", "dma-phase")

    def on_copy_moved(self, event: CopyMoved) -> None:
        """The copy read HBM (a copy-in) or wrote it (a write-back)."""
        track = self._actors.get(event.name)
        started = self._copies.get(event.name)
        if track is None or started is None or self._top(track) != "queued":
            return
        self._end(track)
        self._flow("DMA start -> landing", started, track)
        self._begin(track, "landed, not yet waited", "dma-phase")

    def on_copy_waited(self, event: CopyWaited) -> None:
        track = self._actors.get(event.name)
        if track is None or self._copies.pop(event.name, None) is None:
            return
        self._end(track)
        self._end(track, {"waited_by": event.actor})

    def on_signalled(self, event: Signalled) -> None:
        where = self._core(event.actor, event.device, event.core)
        self._mark("instant", where, f"signal {event.cell.name}", "semaphore")
        self._signalled(event.cell, where, f"signal by {event.actor}")

    def _signalled(self, cell: Cell, where: tuple[int, str], what: str) -> None:
        self._signals.setdefault(cell.key, []).append(
            _Signal(self._clock, self.steps, where[0], where[1], what))

    def on_waited(self, event: Waited) -> None:
        """A wait completed: arrows from the signals it consumed; the DMAs it accounted for
        in full end."""
        where = self._core(event.actor, event.device, event.core)
        key = event.cell.key
        self._mark("instant", where, f"{event.what} {event.cell.name} done", "semaphore")
        for signal in self._signals.pop(key, []):
            self._flow("signal -> wait", (signal.time, signal.step,
                                          (signal.device, signal.track)), where)
        for dma_id, (dst_key, actor, *_rest) in list(self._dmas.items()):
            if dst_key == key and dma_id not in event.owed:
                track = self._actors[actor]
                if self._top(track) == "landed, not yet waited":
                    self._end(track)
                    self._end(track, {"waited_by": event.actor})
                    del self._dmas[dma_id]

    def on_found(self, event: Found) -> None:
        self.finding(event.finding)

    def finding(self, finding: Finding) -> None:
        """An instant where the finding was found, on its actor's track."""
        # A parallel_loop iteration (`sparsecore 0 subcore 3 (parallel_loop iteration i=2)`)
        # acts on its subcore's track.
        actors = [a.split(" (parallel_loop iteration")[0]
                  for a in (finding.actor, *(a.actor for a in finding.accesses)) if a]
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

