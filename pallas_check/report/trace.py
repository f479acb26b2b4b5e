"""`--trace FILE`: the run's timelines as Chrome trace-event JSON (Perfetto, chrome://tracing),
written as the run goes.

The marks come from engine/timeline.py as they happen (read here by attribute only: reports
import no engine). Layout: a process per device of each call (`call 0: kernel - device 1`),
a track per core and per DMA; B/E slices for grid steps (named by grid point), blocked
waits and a DMA's lifetime with its phases (queued -> sending -> landed, not yet waited);
instants for DMA starts, signals, completed waits and findings (args carry the message);
flow arrows signal -> wait and DMA start -> landing. `ts` is logical time: one tick per
scheduler step and per recorded moment, never wall time; the calls are laid one after
another (calls that run at once overlap).

Memory stays bounded however long the run: each mark becomes one line of JSON in a spool
(an unnamed temporary file beside the trace, one per schedule of a call: the call keeps
one of them), and the writer keeps only what is open (tracks with spans open, DMA tracks
in flight) and, per call, one line of facts. When the call ends, the spool it keeps is
appended to the trace file, which is staged beside its target (outfile.StagedFile) and
renamed over it by `close` -- after a normal end, or after Ctrl-C or SIGTERM, when the
call that was stopped is appended as far as it got, its open spans ended (`unfinished`).
The target is only ever the old file or a whole new one.

A finding's instant carries `finding`, an id per defect (every sighting of one defect, as
the report merges them, has the same); `otherData.findings` lists each finding of the JSON
report (`findings`, then `suppressed`) with its id, its `finding_index` there and what
suppressed it: which finding that is is known only when the run ends, the instant long
written by then.
"""

from __future__ import annotations

import itertools
import json
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Mapping, Protocol, Sequence, TypedDict

from pallas_check import __version__
from pallas_check.findings.finding import Finding, JsonObject, JsonValue
from pallas_check.deliver.outfile import StagedFile
from pallas_check.report.run_report import Suppression

SCHEMA = "pallas-check/trace"
SCHEMA_VERSION = 2
TIME_UNIT = ("logical: one tick per scheduler step and per recorded event (shown as 1 us);"
             " not wall time. Calls are laid one after another.")
_GAP = 10  # ticks between two calls
_PHASE = {"begin": "B", "end": "E", "instant": "i", "flow-start": "s", "flow-end": "f"}
_DEPTH = {"begin": 1, "end": -1}  # what a mark does to the spans open on its track
_FLOWS_PER_CALL = 10 ** 9  # a flow's id: call index * this + its number in the call
_HEAD = b'{"traceEvents": ['


class TraceMark(Protocol):
    """What the trace reads of a mark: engine/timeline.py's `Mark` (reports import no
    engine, so it is described here by what is read)."""

    @property
    def kind(self) -> str: ...  # "begin", "end", "instant", "flow-start", "flow-end", "seen"
    @property
    def time(self) -> int: ...
    @property
    def step(self) -> int: ...
    @property
    def device(self) -> int: ...
    @property
    def track(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def category(self) -> str: ...
    @property
    def args(self) -> Mapping[str, JsonValue]: ...
    @property
    def flow(self) -> int: ...
    @property
    def finding(self) -> Finding | None: ...


class TraceSink(Protocol):
    """Where one schedule of a call writes its marks, a moment's together
    (engine/timeline.py's MarkSink)."""

    def add(self, marks: Sequence[TraceMark]) -> None: ...


class TracedTimeline(Protocol):
    """What the trace reads of a finished call's timeline (engine/timeline.py's)."""

    @property
    def sink(self) -> object: ...
    @property
    def steps(self) -> int: ...


class _CallEntry(TypedDict, total=False):
    """One call's line of `otherData.calls`."""

    call: int
    kernel: str
    seed: int
    steps: int
    unfinished: bool  # the run stopped inside it (steps: those recorded)
    capped: dict[str, JsonValue]  # where --trace-limit stopped it


# What adding a mark does to a spool (`_Spool._apply`): the track's key and thread id, the
# span key and the spans open on it, whether the track is done, the latest tick and step.
_Effect = tuple[tuple[int, str], int, tuple[int, int], int, bool, int, int]


class TraceWriter:
    """The trace file of one run (see the module docstring): the engine's timelines write
    to `sink`s, the session `keep`s each call's, the runner `close`s it."""

    def __init__(self, path: Path, script: str) -> None:
        self.path, self.script = path, script
        self.lock = threading.Lock()  # the engine's thread and a stopping one
        self._error: OSError | None = None
        self._staged: StagedFile | None = None
        try:
            self._staged = StagedFile(path)
            self._staged.handle.write(_HEAD)
        except OSError as exc:  # said when the run ends, as a report's would be
            self._error = exc
        self.folder = self._staged.folder if self._staged is not None else None
        self._pending: dict[int, list[_Spool]] = {}  # calls in flight -> their spools
        self._offsets: dict[int, int] = {}  # calls in flight -> their first tick
        self._end = 0  # the tick after every call kept so far
        self._pids: dict[tuple[int, int], int] = {}  # (call in flight, device) -> pid
        self._next_pid = itertools.count(1)
        # a finding's merge key -> its `finding` id
        self._serials: dict[tuple[object, ...], int] = {}
        self._calls: list[_CallEntry] = []  # otherData.calls
        self._empty = True  # no event in the file yet
        self._closed = False
        self.notes: list[str] = []  # for the table: calls whose trace was capped

    # -- while the run goes ---------------------------------------------------------------
    def sink(self, kernel: str, call_index: int, seed: int) -> TraceSink:
        """Where one schedule of a call writes its marks (engine/timeline.py's sink)."""
        with self.lock:
            if self._error is not None or self._closed:
                return _Nowhere()
            offset = self._offsets.setdefault(call_index, self._end)
            spool = _Spool(self, kernel, call_index, seed, offset)
            self._pending.setdefault(call_index, []).append(spool)
            return spool

    def keep(self, timeline: TracedTimeline, findings: Sequence[Finding]) -> None:
        """The call of `timeline` ended and keeps it (its other schedules' spools go):
        `findings`, the call's, that it never marked (found after the simulation, or
        under another seed) are instants on its `call` track after its end."""
        spool = timeline.sink
        if not isinstance(spool, _Spool):
            return
        with self.lock:
            if self._closed or spool.call_index not in self._pending:
                return
            late = [f for f in findings if self._serial(f) not in spool.marked]
            spool.finish(timeline, late)
            self._append(spool.call_index)

    def _serial(self, finding: Finding) -> int:
        """The `finding` id of a finding's defect (the lock held, as below)."""
        return self._serials.setdefault(finding.merge_key(), len(self._serials) + 1)

    def _pid(self, call_index: int, device: int) -> int:
        pid = self._pids.get((call_index, device))
        if pid is None:
            pid = self._pids[(call_index, device)] = next(self._next_pid)
        return pid

    def _append(self, call_index: int) -> None:
        """The call's finished spool (else its latest, as far as it got) into the file."""
        spools = self._pending[call_index]
        spool = next((s for s in spools if s.entry is not None), spools[-1])
        if spool.entry is None:  # stopped inside the call
            spool.finish(None, [])
        assert spool.entry is not None  # finish() sets it
        assert self._staged is not None
        handle = self._staged.handle
        start = handle.tell()
        try:
            spool.file.seek(2 if self._empty else 0)  # (every line begins with ",\n")
            shutil.copyfileobj(spool.file, handle, 1 << 20)
        except BaseException:  # stopped while copying: the file as it was; `close` retries
            handle.seek(start)
            handle.truncate()
            raise
        self._empty = self._empty and handle.tell() == start
        for other in self._pending.pop(call_index):
            other.discard()
        for key in [k for k in self._pids if k[0] == call_index]:
            del self._pids[key]
        self._offsets.pop(call_index, None)
        self._calls.append(spool.entry)
        self._end = max(self._end, spool.last + _GAP)
        if spool.capped_note:
            self.notes.append(spool.capped_note)

    # -- the end --------------------------------------------------------------------------
    @property
    def calls_written(self) -> int:
        return len(self._calls)

    def close(self, findings: Sequence[Finding],
              suppressed: Sequence[tuple[Finding, Suppression]]) -> None:
        """Write the end of the file and put it in place: the calls still in flight (a
        stopped run) as far as they got; `findings` and `suppressed` are the report's.
        Raises OSError when the file cannot be written."""
        with self.lock:
            if self._error is not None:
                raise self._error
            if self._closed:
                return
            self._closed = True
            assert self._staged is not None
            try:
                for call_index in sorted(self._pending):
                    self._append(call_index)
                self._staged.handle.write(self._tail(findings, suppressed))
                self._staged.commit()
            except BaseException:
                self._staged.discard()
                raise

    def _tail(self, findings: Sequence[Finding],
              suppressed: Sequence[tuple[Finding, Suppression]]) -> bytes:
        ordered = [*((f, None) for f in findings), *((f, w.by) for f, w in suppressed)]
        other = {
            "schema": SCHEMA, "schema_version": SCHEMA_VERSION,
            "tool": f"pallas-check {__version__}", "script": self.script, "time": TIME_UNIT,
            "calls": sorted(self._calls, key=lambda c: c["call"]),
            "findings": [{"finding": self._serials.get(f.merge_key()), "finding_index": i,
                          "suppressed": by} for i, (f, by) in enumerate(ordered)]}
        return ("\n],\n\"displayTimeUnit\": \"ns\",\n\"otherData\": "
                + json.dumps(other, indent=1) + "}\n").encode()


class _Nowhere:
    """A sink for a trace that cannot be written (said when the run ends)."""

    def add(self, marks: Sequence[TraceMark]) -> None:
        pass


def _track_order(track: str) -> int:
    """Cores (TensorCores, SparseCore subcores) first, then DMAs, then the call's own track."""
    return 1 if track.startswith(("core", "sparsecore")) else 2 if track.startswith("DMA") else 3


class _Spool:
    """One schedule's timeline as trace events, one line each as its marks come (see the
    module docstring). It keeps the tracks it named (a DMA's only while the DMA is in
    flight) and how many spans are open on each.

    A stop (Ctrl-C, SIGTERM) raises wherever the engine is, in `add` too: a moment's lines
    are written by one `write`, what the spool knows after it is applied after it (by
    assignments: applying twice is applying once), and what was being added is kept
    until then, so that `finish` can tell whether the lines went out and apply their
    effect if they did: the file and what the spool knows of it agree."""

    def __init__(self, writer: TraceWriter, kernel: str, call_index: int, seed: int,
                 offset: int) -> None:
        self.writer, self.kernel, self.call_index, self.seed = writer, kernel, call_index, seed
        self.offset = offset
        self.file = tempfile.TemporaryFile(dir=writer.folder)
        self.tracks: dict[tuple[int, str], int] = {}  # (device, track) -> thread id
        self.devices: set[int] = set()  # those whose process is named
        self.depth: dict[tuple[int, int], int] = {}  # (pid, tid) -> spans open on it
        self.marked: set[int] = set()  # the findings marked (or seen), by `finding` id
        self.last = offset  # the latest tick written
        self.step = 0  # the latest scheduler step
        self.entry: _CallEntry | None = None  # otherData.calls', once finished
        self.capped: dict[str, JsonValue] | None = None  # where --trace-limit stopped it
        self.capped_note = ""
        self._done = False
        self._tids = itertools.count(1)
        # (file size before, the effects) of the moment being written
        self._adding: tuple[int, list[_Effect]] | None = None
        self.size = 0  # bytes written

    def add(self, marks: Sequence[TraceMark]) -> None:
        """One moment's marks, written by one `write`: a stop finds the moment in the file
        whole or not at all (never a DMA's landing arrow without the phase it lands in).
        Each mark is rendered as the spool will be after the ones before it (on copies of
        what it knows: a stop while rendering leaves it as it was)."""
        with self.writer.lock:
            if self._done:
                return
            chunks: list[bytes] = []
            effects: list[_Effect] = []
            known = self.tracks, self.depth, self.devices, self.last, self.step
            self.tracks, self.depth, self.devices = (dict(self.tracks), dict(self.depth),
                                                     set(self.devices))
            try:
                for mark in marks:
                    if mark.finding is not None:
                        self.marked.add(self.writer._serial(mark.finding))
                    if mark.kind == "seen":
                        continue
                    if mark.category == "capped":  # (engine/timeline.py's instant at the cap)
                        self.capped = {"limit": mark.args["limit"],
                                       "grid_steps": mark.args["grid_steps"],
                                       "step": mark.step}
                    lines, effect = self._render(mark)
                    self._apply(effect)
                    chunks.append(lines)
                    effects.append(effect)
            finally:
                self.tracks, self.depth, self.devices, self.last, self.step = known
            if not chunks:
                return
            self._adding = (self.size, effects)
            self.size += self.file.write(b"".join(chunks))
            for effect in effects:
                self._apply(effect)
            self._adding = None

    def _render(self, mark: TraceMark) -> tuple[bytes, _Effect]:
        """A mark's lines (a new track's names first) and its effect on the spool."""
        key = (mark.device, mark.track)
        pid = self.writer._pid(self.call_index, mark.device)
        tid = self.tracks.get(key)
        lines: list[JsonObject] = []
        if tid is None:
            tid = next(self._tids)
            lines = self._names(mark.device, mark.track, pid, tid)
        ts = self.offset + mark.time
        event: JsonObject = {"ph": _PHASE[mark.kind], "ts": ts, "pid": pid, "tid": tid}
        if mark.kind != "end":
            event["name"] = mark.name
            event["cat"] = mark.category
        if mark.kind.startswith("flow"):
            event["id"] = self.call_index * _FLOWS_PER_CALL + mark.flow
            if mark.kind == "flow-end":
                event["bp"] = "e"
        else:
            if mark.kind == "instant":
                event["s"] = "t"
            args: JsonObject = {**mark.args, "step": mark.step}
            if mark.finding is not None:
                args["finding"] = self.writer._serial(mark.finding)
            event["args"] = args
        lines.append(event)
        depth = self.depth.get((pid, tid), 0) + _DEPTH.get(mark.kind, 0)
        # A DMA's track ends with its lifetime: nothing more is drawn on it.
        track_done = depth <= 0 and mark.kind == "end" and mark.track.startswith("DMA #")
        return _lines(lines), (key, tid, (pid, tid), depth, track_done, max(self.last, ts),
                               mark.step)

    def _names(self, device: int, track: str, pid: int, tid: int) -> list[JsonObject]:
        """The metadata naming a new track (and its process, when it is the first)."""
        names: list[JsonObject] = []
        if device not in self.devices:
            name = f"call {self.call_index}: {self.kernel} - device {device}"
            names += [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0,
                       "args": {"name": name}},
                      {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                       "ts": 0, "args": {"sort_index": pid}}]
        return names + [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "ts": 0,
                         "args": {"name": track}},
                        {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                         "ts": 0, "args": {"sort_index": _track_order(track) * 10 ** 7
                                           + tid}}]

    def _apply(self, effect: _Effect) -> None:
        key, tid, span_key, depth, track_done, last, step = effect
        self.devices.add(key[0])
        if track_done:
            self.tracks.pop(key, None)
        else:
            self.tracks[key] = tid
        if depth > 0:
            self.depth[span_key] = depth
        else:
            self.depth.pop(span_key, None)
        self.last, self.step = last, step

    def _recover(self) -> None:
        """The effect of a mark a stop cut short: applied if its lines went out."""
        if self._adding is not None:
            before, effects = self._adding
            if self.file.tell() > before:  # (the write went out, `size` not yet counted)
                for effect in effects:  # (each an assignment: applying again is harmless)
                    self._apply(effect)
            self._adding = None

    def finish(self, timeline: TracedTimeline | None, late: Sequence[Finding]) -> None:
        """No more marks: spans still open end (`unfinished`: a call stopped inside, its
        `timeline` None), then the `late` findings; the call's line of otherData."""
        self._done = True
        self._recover()
        for (pid, tid), depth in sorted(self.depth.items()):
            self.file.write(_lines([{"ph": "E", "ts": self.last + n, "pid": pid, "tid": tid,
                                     "args": {"unfinished": True, "step": self.step}}
                                    for n in range(1, depth + 1)]))
            self.last += depth
            del self.depth[(pid, tid)]
        for finding in late:
            self.last += 1
            self._late(finding)
        entry: _CallEntry = {"call": self.call_index, "kernel": self.kernel,
                             "seed": self.seed, "steps": self.step}
        if timeline is None:
            entry["unfinished"] = True  # the run stopped inside it (steps: those recorded)
        else:
            entry["steps"] = timeline.steps
        if self.capped is not None:
            entry["capped"] = self.capped
            self.capped_note = (
                f"the trace of call {self.call_index} ({self.kernel}) stops after"
                f" {self.capped['grid_steps']} grid step(s), at --trace-limit"
                f" {self.capped['limit']} events; later, only its findings are marked")
        self.entry = entry
        self.file.flush()

    def _late(self, finding: Finding) -> None:
        """A finding made after the simulation (comparing two fills) or under another seed."""
        pid, tid = self._call_track()
        self.file.write(_lines([{"ph": "i", "s": "t", "ts": self.last, "pid": pid, "tid": tid,
                     "name": f"{finding.kind.value}: {finding.buffer}", "cat": "finding",
                     "args": {"kind": finding.kind.value, "message": finding.message,
                              "grid_point": (None if finding.grid_point is None
                                             else list(finding.grid_point)),
                              "actor": finding.actor, "after_simulation": True,
                              "seed": finding.seed, "step": self.step,
                              "finding": self.writer._serial(finding)}}]))

    def _call_track(self) -> tuple[int, int]:
        """The call's own track (device 0's), named if new."""
        pid = self.writer._pid(self.call_index, 0)
        tid = self.tracks.get((0, "call"))
        if tid is None:
            tid = next(self._tids)
            self.file.write(_lines(self._names(0, "call", pid, tid)))
            self._apply(((0, "call"), tid, (pid, tid), 0, False, self.last, self.step))
        return pid, tid

    def discard(self) -> None:
        self._done = True
        self.file.close()


_ENCODE = json.JSONEncoder(separators=(",", ":")).encode  # (made once: dumps makes one a call)


def _lines(events: list[JsonObject]) -> bytes:
    """Trace events as the file has them: each on a line of its own after a comma."""
    return "".join([",\n" + _ENCODE(e) for e in events]).encode()
