"""`--trace FILE`: the run's timelines as Chrome trace-event JSON (Perfetto, chrome://tracing).

The data comes from engine/timeline.py (read here by attribute only: reports import no
engine). Layout: a process per device of each call (`call 0: kernel - device 1`), a track
per core and per DMA; B/E slices for grid steps (named by grid point), blocked waits and a
DMA's lifetime with its phases (queued -> sending -> landed, not yet waited); instants for
DMA starts, signals, completed waits and findings (args carry the message); flow arrows
signal -> wait and DMA start -> landing. `ts` is logical time: one tick per scheduler step
and per recorded moment, never wall time; the calls are laid one after another.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Sequence

from pallas_check import __version__
from pallas_check.findings import Finding

SCHEMA = "pallas-check/trace"
SCHEMA_VERSION = 1
TIME_UNIT = ("logical: one tick per scheduler step and per recorded event (shown as 1 us);"
             " not wall time. Calls are laid one after another.")
_GAP = 10  # ticks between two calls
_PHASE = {"begin": "B", "end": "E", "instant": "i", "flow-start": "s", "flow-end": "f"}


def trace_dict(timelines: Sequence[Any], findings: Sequence[Finding],
               suppressed: Sequence[tuple[Finding, Any]], script: str) -> dict[str, Any]:
    """The trace of every recorded call, in call order."""
    ordered = [*findings, *(f for f, _ in suppressed)]
    index = {id(f): i for i, f in enumerate(ordered)}
    why = {id(f): w.by for f, w in suppressed}
    # A finding's message as reported (pallas_check/judge.py adds to it after the call).
    messages = {id(f): f.message for f in ordered}
    events: list[dict[str, Any]] = []
    metadata: list[dict[str, Any]] = []
    offset, pid, flow_base = 0, 0, 0
    for timeline in sorted(timelines, key=lambda t: t.call_index):
        marks = timeline.snapshot()
        pids: dict[int, int] = {}
        tracks: dict[tuple[int, str], int] = {}
        for device in sorted({m.device for m in marks}) or [0]:
            pid += 1
            pids[device] = pid
        body = [_event(m, offset, pids, tracks, flow_base, index, why, messages)
                for m in marks]
        last = max((m.time for m in marks), default=0)
        late = [f for f in ordered if f.call_index == timeline.call_index
                and id(f) not in {id(g) for g in timeline.findings}]
        for n, finding in enumerate(late, start=1):
            body.append(_late_finding(finding, offset + last + n, timeline.steps, pids, tracks,
                                      index, why))
        metadata += _metadata(timeline, pids, tracks)
        events += body
        offset += last + len(late) + _GAP
        flow_base += sum(1 for m in marks if m.kind == "flow-start")
    return {
        "traceEvents": metadata + events,
        "displayTimeUnit": "ns",
        "otherData": {"schema": SCHEMA, "schema_version": SCHEMA_VERSION,
                      "tool": f"pallas-check {__version__}", "script": script,
                      "time": TIME_UNIT,
                      "calls": [{"call": t.call_index, "kernel": t.kernel, "seed": t.seed,
                                 "steps": t.steps} for t in timelines]},
    }


def _track(mark_device: int, track: str, pids: dict[int, int],
           tracks: dict[tuple[int, str], int]) -> tuple[int, int]:
    key = (mark_device, track)
    if key not in tracks:
        tracks[key] = _track_order(track) * 1000 + len(tracks)
    return pids.setdefault(mark_device, max(pids.values(), default=0) + 1), tracks[key]


def _track_order(track: str) -> int:
    """Cores (TensorCores, SparseCore subcores) first, then DMAs, then the call's own track."""
    return 1 if track.startswith(("core", "sparsecore")) else 2 if track.startswith("DMA") else 3


def _event(mark: Any, offset: int, pids: dict[int, int], tracks: dict[tuple[int, str], int],
           flow_base: int, index: dict[int, int], why: dict[int, str],
           messages: dict[int, str] | None = None) -> dict[str, Any]:
    pid, tid = _track(mark.device, mark.track, pids, tracks)
    event: dict[str, Any] = {"ph": _PHASE[mark.kind], "ts": offset + mark.time, "pid": pid,
                             "tid": tid}
    if mark.kind != "end":
        event["name"] = mark.name
        event["cat"] = mark.category
    args = {**mark.args, "step": mark.step}
    if "finding" in args:  # an object id: the finding's place in the report instead
        key = args.pop("finding")
        args["finding_index"] = index.get(key)
        args["suppressed"] = why.get(key)
        if messages and key in messages:
            args["message"] = messages[key]
    if mark.kind == "instant":
        event["s"] = "t"
    if mark.kind.startswith("flow"):
        event["id"] = flow_base + mark.flow
        if mark.kind == "flow-end":
            event["bp"] = "e"
        return event
    event["args"] = args
    return event


def _late_finding(finding: Finding, ts: int, step: int, pids: dict[int, int],
                  tracks: dict[tuple[int, str], int], index: dict[int, int],
                  why: dict[int, str]) -> dict[str, Any]:
    """A finding made after the simulation (comparing two fills) or under another seed."""
    pid, tid = _track(0, "call", pids, tracks)
    return {"ph": "i", "s": "t", "ts": ts, "pid": pid, "tid": tid,
            "name": f"{finding.kind.value}: {finding.buffer}", "cat": "finding",
            "args": {"kind": finding.kind.value, "message": finding.message,
                     "grid_point": (None if finding.grid_point is None
                                   else list(finding.grid_point)),
                     "actor": finding.actor, "finding_index": index.get(id(finding)),
                     "suppressed": why.get(id(finding)), "after_simulation": True,
                     "seed": finding.seed, "step": step}}


def _metadata(timeline: Any, pids: dict[int, int],
              tracks: dict[tuple[int, str], int]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for device, pid in sorted(pids.items()):
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0,
                       "args": {"name": f"call {timeline.call_index}: {timeline.kernel}"
                                        f" - device {device}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                       "ts": 0, "args": {"sort_index": pid}})
    for (device, track), tid in sorted(tracks.items(), key=lambda kv: kv[1]):
        pid = pids[device]
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "ts": 0,
                       "args": {"name": track}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                       "ts": 0, "args": {"sort_index": tid}})
    return events


def trace_text(timelines: Iterable[Any], findings: Sequence[Finding],
               suppressed: Sequence[tuple[Finding, Any]], script: str) -> str:
    return json.dumps(trace_dict(list(timelines), findings, suppressed, script),
                      indent=1) + "\n"
