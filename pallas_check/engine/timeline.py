"""A timeline of one simulated call, recorded as it happens (`--trace`).

A listener of the engine's events (engine/events.py) and the scheduler's observer; it
never changes what the simulation does, and it prints nothing. Its clock is logical: one
tick per scheduler step and per recorded moment, so every moment has its own time and the
order is exactly the simulation's. Each moment's marks (`Mark`s) are handed to the
timeline's sink together as it happens, in time order (a flow arrow starts where its
source is and ends where its target is: an arrow whose end never comes, a signal no wait
consumed, has its start only); `report/trace.py`'s sink writes it to the Chrome
trace-event file at once. The timeline itself keeps only what is open now (spans, DMAs
and copies in flight, signals not yet waited), so that its memory is bounded by what is in
flight, not by the length of the call.

Tracks are the cores (`core 0`, per device) and the DMAs (`DMA #3`). Spans nest per track:
a core's grid steps hold its blocked waits; a DMA's lifetime holds its phases (queued ->
sending -> landed), from its start to the wait that accounts for it.

A very long call is capped: after `limit` marks (`--trace-limit`) every open span ends
(args `capped`), an instant on the call's track says so, and from then on only findings
are marked (at most MAX_FINDING_MARKS of them per call; the rest are only `seen`).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Any, Callable, Protocol, Sequence, TypeVar, cast

from pallas_check.engine.events import (ActorsDeclared, Cell, CopyMoved, CopyStarted,
                                        CopyWaited, CoreDone, DmaMoved, DmaStarted, Found,
                                        GridStep, Listener, Signalled, Waited)
from pallas_check.findings.finding import Finding, SourceFrame


# A semaphore cell's identity (events.Cell.key): its buffer id and index.
CellKey = tuple[int, tuple[int, ...]]


class Blocking(Protocol):
    """What the timeline shows of a wait that blocks (engine/runtime/scheduler.py's Wait,
    a wing it does not import)."""

    @property
    def what(self) -> str: ...

    @property
    def semaphore(self) -> str: ...

    @property
    def wanted(self) -> int: ...

    @property
    def frames(self) -> tuple[SourceFrame, ...]: ...


CALL_TRACK = "call"  # where a finding with no known actor is marked
MAX_FINDING_MARKS = 10_000  # finding instants per call (a finding at every step of 10**6)
MAX_PENDING_SIGNALS = 64  # per semaphore cell: the arrows a wait may still end
_OTHER_TRACKS = ("DMA #", "pipeline ")  # the tracks of DMAs and copies, not of cores


@dataclasses.dataclass(frozen=True, slots=True)
class Mark:
    """One moment on one track: a span's begin or end, an instant, a flow's start or end,
    or a finding `seen` but not marked (past MAX_FINDING_MARKS: drawn nowhere)."""

    kind: str  # "begin", "end", "instant", "flow-start", "flow-end", "seen"
    time: int
    step: int  # the scheduler step it happened in
    device: int
    track: str
    name: str = ""
    category: str = ""
    args: dict[str, object] = dataclasses.field(default_factory=dict)
    flow: int = 0  # a flow's id (flow-start and flow-end share it)
    finding: Finding | None = None  # a finding's instant (or `seen`): the finding


class MarkSink(Protocol):
    """Where a timeline's marks go as they happen (report/trace.py's writer): one moment's
    marks together (a DMA landing ends its `sending` phase, ends the arrow from its start
    and begins its `landed` phase), so that a stop (Ctrl-C, SIGTERM), which raises
    wherever the run is, finds each moment in the file whole or not at all."""

    def add(self, marks: Sequence[Mark]) -> None: ...


class Marks(list[Mark]):
    """A sink that keeps every mark in memory: a timeline no file is written for (tests,
    a `Session` with `Config.timeline` and no trace writer)."""

    def add(self, marks: Sequence[Mark]) -> None:
        self.extend(marks)


_Handler = TypeVar("_Handler", bound=Callable[..., None])


def _one_moment(handler: _Handler) -> _Handler:
    """A method whose marks are one moment: handed to the sink together when it returns,
    and not at all when a stop raises inside it (the sink never saw any of them)."""

    @functools.wraps(handler)
    def whole(self: "Timeline", *args: Any) -> None:
        if self._moment is not None:  # (inside another moment: part of it)
            handler(self, *args)
            return
        moment: list[Mark] = []
        self._moment = moment
        try:
            handler(self, *args)
        finally:
            self._moment = None
        if moment:
            self.sink.add(moment)
    return cast(_Handler, whole)


class Timeline(Listener):
    """Records one schedule of one call (see the module docstring): a listener of the
    engine's events, and the scheduler's observer."""

    needs_unwritten_accesses = False  # (it reads no access: a DMA's or copy's moments only)

    def __init__(self, kernel: str, call_index: int, seed: int,
                 sink: MarkSink | None = None, limit: int = 0) -> None:
        self.kernel, self.call_index, self.seed = kernel, call_index, seed
        self.sink: MarkSink = sink if sink is not None else Marks()
        self.limit = limit  # marks before the cap (0: none)
        self.recorded = 0  # marks handed to the sink
        self.steps = 0
        self.grid_steps = 0  # grid steps begun (on every core)
        # Where the cap came: (grid steps, scheduler step); None while it has not.
        self.capped: tuple[int, int] | None = None
        self.findings_marked = 0
        self._clock = 0
        self._open: dict[tuple[int, str], list[str]] = {}  # track -> names of open spans
        self._actors: dict[str, tuple[int, str]] = {}  # actor name -> (device, track)
        self._tracks: dict[tuple[int, int], str] = {}  # (device, core) -> its core's track
        self._signals: dict[CellKey, list[int]] = {}  # cell -> arrows a wait will end
        # DMA id -> its receive semaphore's key, its actor, its arrow start -> landing
        self._dmas: dict[int, tuple[CellKey, str, int]] = {}
        self._copies: dict[str, int] = {}  # pipeline copy in flight -> its arrow
        self._flows = itertools.count(1)
        self._moment: list[Mark] | None = None  # the marks of the moment being recorded

    # -- the clock and the primitive marks ------------------------------------------------
    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _mark(self, kind: str, where: tuple[int, str], name: str = "", category: str = "",
              args: dict[str, object] | None = None, time: int | None = None,
              finding: Finding | None = None) -> Mark:
        return self._put(Mark(kind, self._tick() if time is None else time, self.steps,
                              where[0], where[1], name, category, args or {}, 0, finding))

    def _flow_mark(self, kind: str, where: tuple[int, str], name: str, flow: int,
                   time: int | None = None) -> Mark:
        """One end of an arrow between tracks (`flow` its id, shared by both ends)."""
        return self._put(Mark(kind, self._tick() if time is None else time, self.steps,
                              where[0], where[1], name, "flow", {}, flow, None))

    def _put(self, mark: Mark) -> Mark:
        if self._moment is not None:
            self._moment.append(mark)
        else:
            self.sink.add((mark,))
        self.recorded += 1
        return mark

    def _begin(self, where: tuple[int, str], name: str, category: str,
               args: dict[str, object] | None = None) -> None:
        self._open.setdefault(where, []).append(name)
        self._mark("begin", where, name, category, args)

    def _end(self, where: tuple[int, str], args: dict[str, object] | None = None) -> None:
        stack = self._open.get(where)
        if stack:
            self._mark("end", where, stack.pop(), args=args)
            if not stack:
                del self._open[where]

    def _top(self, where: tuple[int, str]) -> str | None:
        stack = self._open.get(where)
        return stack[-1] if stack else None

    def _flow_start(self, where: tuple[int, str], name: str) -> int:
        """An arrow from now on `where` (it shares the time of the moment just marked);
        its end comes with `_flow_end`, or never."""
        flow = next(self._flows)
        self._flow_mark("flow-start", where, name, flow, time=self._clock)
        return flow

    def _flow_end(self, flow: int, target: tuple[int, str], name: str) -> None:
        self._flow_mark("flow-end", target, name, flow)

    # -- the cap --------------------------------------------------------------------------
    def _stopped(self) -> bool:
        """Whether this moment goes unrecorded: the call has reached its cap (capping it
        now, between two moments, when it just did)."""
        if self.capped is not None:
            return True
        if not self.limit or self.recorded < self.limit:
            return False
        self._end_open({"capped": True})
        self._mark("instant", (0, CALL_TRACK), "trace capped", "capped",
                   {"limit": self.limit, "grid_steps": self.grid_steps,
                    "note": "nothing more of this call is recorded but its findings"})
        self.capped = (self.grid_steps, self.steps)
        self._signals.clear()
        self._dmas.clear()
        self._copies.clear()
        self._actors = {a: w for a, w in self._actors.items()
                        if not w[1].startswith(_OTHER_TRACKS)}
        return True

    def _end_open(self, args: dict[str, object]) -> None:
        """End every open span now, innermost first, track by track."""
        for where, stack in sorted(self._open.items()):
            for name in reversed(stack):
                self._mark("end", where, name, args=args)
        self._open.clear()

    # -- the scheduler --------------------------------------------------------------------
    @_one_moment
    def scheduled(self, actor: str) -> None:
        """The scheduler picked `actor` (one logical step)."""
        self.steps += 1
        if self._stopped():
            return
        self._tick()
        where = self._actors.get(actor)
        if where is not None and (self._top(where) or "").startswith("blocked"):
            self._end(where)

    @_one_moment
    def blocked(self, actor: str, wait: Blocking) -> None:
        """`actor` cannot go on until `wait` holds."""
        where = self._actors.get(actor)
        if where is None or self._stopped():
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

    @_one_moment
    def on_grid_step(self, event: GridStep) -> None:
        self.grid_steps += 1
        if self._stopped():
            return
        where = self._core(event.actor, event.device, event.core)
        if self._top(where) is not None:
            self._end(where)  # the previous grid step
        self._begin(where, f"grid {event.point}", "grid-step",
                    {"grid_point": list(event.point)})

    @_one_moment
    def on_core_done(self, event: CoreDone) -> None:
        where = self._actors.get(event.actor)
        if where is not None and not self._stopped():
            self._end(where)

    @_one_moment
    def on_dma_started(self, event: DmaStarted) -> None:
        if self._stopped():
            return
        here = self._core(event.starter, event.device, event.core)
        track = (event.device, f"DMA #{event.id}")
        self._actors[event.actor] = track
        self._mark("instant", here, f"start DMA #{event.id}", "dma",
                   {"src": event.src, "dst": event.dst})
        flow = self._flow_start(here, "DMA start -> landing")
        self._dmas[event.id] = (event.dst_cell.key, event.actor, flow)
        frame = event.frames[0] if event.frames else None
        self._begin(track, f"DMA #{event.id} {event.src} -> {event.dst}",
                    "dma", {"bytes": event.nbytes, "started_by": event.starter,
                            "at": f"{frame.file}:{frame.line}" if frame else "",
                            "to_device": event.to_device})
        self._begin(track, "queued", "dma-phase")
        if event.carried and event.read_done:  # carried in, already past its read
            self._dma_read(event.id, event.actor, ())

    @_one_moment
    def on_dma_moved(self, event: DmaMoved) -> None:
        if event.replayed or self._stopped():  # (replayed: landed in an earlier call)
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
                self._signalled(cell, track)
            self._begin(track, "sending", "dma-phase")

    def _dma_landed(self, dma_id: int, actor: str, cells: tuple[Cell, ...]) -> None:
        """The DMA wrote its destination (its receive side) and signalled `cells`."""
        track = self._actors.get(actor)
        started = self._dmas.get(dma_id)
        if track is None or started is None:
            return
        self._end(track)  # sending
        self._flow_end(started[2], track, "DMA start -> landing")
        for cell in cells:
            self._signalled(cell, track)
        self._begin(track, "landed, not yet waited", "dma-phase")

    @_one_moment
    def on_copy_started(self, event: CopyStarted) -> None:
        """A BlockSpec pipeline copy started: a lifetime slice on the track of the VMEM
        buffer it fills or drains (`pipeline x_ref buffer 1`, one per double buffer)."""
        if self._stopped():
            return
        here = self._core(event.actor, event.device, event.core)
        track = (event.device, f"pipeline {event.operand} buffer {event.buffer}"
                 + (f" (core {event.core})" if event.core else ""))
        name = event.name
        self._actors[name] = track
        self._mark("instant", here, f"start {name}", "dma")
        self._copies[name] = self._flow_start(here, "DMA start -> landing")
        self._begin(track, name, "dma", {"started_by": event.actor})
        self._begin(track, "queued", "dma-phase")

    @_one_moment
    def on_copy_moved(self, event: CopyMoved) -> None:
        """The copy read HBM (a copy-in) or wrote it (a write-back)."""
        if self._stopped():
            return
        track = self._actors.get(event.name)
        flow = self._copies.get(event.name)
        if track is None or flow is None or self._top(track) != "queued":
            return
        self._end(track)
        self._flow_end(flow, track, "DMA start -> landing")
        self._begin(track, "landed, not yet waited", "dma-phase")

    @_one_moment
    def on_copy_waited(self, event: CopyWaited) -> None:
        if self._stopped():
            return
        track = self._actors.pop(event.name, None)  # a later copy may take its name
        if track is None or self._copies.pop(event.name, None) is None:
            return
        self._end(track)
        self._end(track, {"waited_by": event.actor})

    @_one_moment
    def on_signalled(self, event: Signalled) -> None:
        if self._stopped():
            return
        where = self._core(event.actor, event.device, event.core)
        self._mark("instant", where, f"signal {event.cell.name}", "semaphore")
        self._signalled(event.cell, where)

    def _signalled(self, cell: Cell, where: tuple[int, str]) -> None:
        """An arrow from this signal to the wait that will consume it (the oldest ones
        of a cell never waited are let go: their arrows have no end)."""
        pending = self._signals.setdefault(cell.key, [])
        pending.append(self._flow_start(where, "signal -> wait"))
        if len(pending) > MAX_PENDING_SIGNALS:
            del pending[0]

    @_one_moment
    def on_waited(self, event: Waited) -> None:
        """A wait completed: arrows from the signals it consumed; the DMAs it accounted for
        in full end (and their tracks with them)."""
        if self._stopped():
            return
        where = self._core(event.actor, event.device, event.core)
        key = event.cell.key
        self._mark("instant", where, f"{event.what} {event.cell.name} done", "semaphore")
        for flow in self._signals.pop(key, []):
            self._flow_end(flow, where, "signal -> wait")
        for dma_id, (dst_key, actor, _flow) in list(self._dmas.items()):
            if dst_key == key and dma_id not in event.owed:
                track = self._actors[actor]
                if self._top(track) == "landed, not yet waited":
                    self._end(track)
                    self._end(track, {"waited_by": event.actor})
                    del self._dmas[dma_id]
                    del self._actors[actor]

    def on_found(self, event: Found) -> None:
        self.finding(event.finding)

    @_one_moment
    def finding(self, finding: Finding) -> None:
        """An instant where the finding was found, on its actor's track (past
        MAX_FINDING_MARKS, only `seen`: the sink knows it was found during the run)."""
        # A parallel_loop iteration (`sparsecore 0 subcore 3 (parallel_loop iteration i=2)`)
        # acts on its subcore's track.
        actors = [a.split(" (parallel_loop iteration")[0]
                  for a in (finding.actor, *(a.actor for a in finding.accesses)) if a]
        where = next((self._actors[a] for a in actors if a in self._actors), (0, CALL_TRACK))
        if self.findings_marked >= MAX_FINDING_MARKS:
            self._mark("seen", where, time=self._clock, finding=finding)
            return
        self.findings_marked += 1
        self._mark("instant", where, f"{finding.kind.value}: {finding.buffer}", "finding",
                   {"kind": finding.kind.value, "message": finding.message,
                    "grid_point": (None if finding.grid_point is None
                                   else list(finding.grid_point)),
                    "actor": finding.actor}, finding=finding)

    # -- the end --------------------------------------------------------------------------
    @_one_moment
    def finish(self) -> None:
        """The schedule is over: the spans still open (a deadlock's blocked actors, DMAs
        never waited) end after the last moment, innermost first."""
        self._end_open({"unfinished": True})
