"""`--trace` written as the run goes (issue 36, item 9): the recorder keeps what is open,
not what was recorded, so a call of a million grid steps can be traced; the file is whole
JSON after a normal end and after SIGTERM (the call the run stopped in as far as it got);
`--trace-limit` caps what one call records, and the file and the table say so."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest

from _cli_worker import run_cli
from cli.test_stopping import LONG_RACE, finish, start, wait_for
from report.test_trace import _check_flows, _spans, check_trace

from pallas_check.config.exitcodes import ExitCode

ROOT = Path(__file__).resolve().parents[2]
LONG_DMA = ROOT / "tests" / "scripts" / "long_dma.py"


def _grid_steps(trace: dict) -> list[list[int]]:
    return [e["args"]["grid_point"] for e in trace["traceEvents"]
            if e["ph"] == "B" and e["cat"] == "grid-step"]


def test_the_recorder_keeps_no_more_after_more_steps(tmp_path):
    """long_dma.py measures, from inside the call, the memory allocated by the recorder
    (engine/timeline.py, report/trace.py) that is still alive: at step 50 and at step 199
    of 200 it is the same (it kept every mark: some 4.8 KB and 74 blocks more per step)."""
    trace, report = tmp_path / "run.trace.json", tmp_path / "report.json"
    proc = run_cli(["run", "--trace", str(trace), "--format", "json", "-o", str(report),
                    str(LONG_DMA), "--", "200"], timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    retained = {int(step): (int(size), int(blocks)) for step, size, blocks in
                re.findall(r"^retained (\d+) (\d+) (\d+)$", proc.stdout, re.M)}
    assert sorted(retained) == [50, 199], proc.stdout
    (size, blocks), (later_size, later_blocks) = retained[50], retained[199]
    assert later_size <= size + 2048 and later_blocks <= blocks + 16, retained
    data = json.loads(trace.read_text())
    check_trace(data, json.loads(report.read_text()))
    assert _grid_steps(data) == [[i] for i in range(200)]
    assert [(c["call"], "capped" in c) for c in data["otherData"]["calls"]] == [(0, False)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json", "run.trace.json"]


def test_sigterm_leaves_a_whole_trace_with_the_call_it_stopped(tmp_path):
    """A real process, stopped by SIGTERM inside a long call: the trace is valid JSON, with
    that call as far as it got (its open spans ended `unfinished`), the race it made at
    each step marked; nothing else is left in the folder."""
    trace, report = tmp_path / "run.trace.json", tmp_path / "report.json"
    process = start(["run", str(LONG_RACE), "--races", "--trace", str(trace), "--format",
                     "json", "-o", str(report), "--", "50000"], tmp_path)
    wait_for(process, "running")  # grid step 1 is being simulated
    process.send_signal(signal.SIGTERM)
    code, stderr, _ = finish(process)
    assert code == ExitCode.USER_ERROR, stderr
    data, findings = json.loads(trace.read_text()), json.loads(report.read_text())
    assert findings["partial"] is True and findings["trace"] == "run.trace.json"
    check_trace(data, findings)
    steps = _grid_steps(data)
    done = findings["calls"][0]["progress"]["steps_done"]
    assert 2 <= len(steps) and steps == [[i] for i in range(len(steps))]
    assert len(steps) in (done, done + 1)  # (the step running when it stopped, begun)
    [call] = data["otherData"]["calls"]
    assert (call["call"], call["kernel"], call.get("unfinished")) == (0, "racy_kernel", True)
    ends = [e for e in data["traceEvents"] if e["ph"] == "E"]
    if len(steps) == done + 1:  # stopped inside a grid step: its span ends unfinished
        assert ends[-1]["args"].get("unfinished") is True
    else:  # (stopped between two steps: every step begun had finished)
        assert not any(e["args"].get("unfinished") for e in ends
                       if e.get("cat") == "grid-step")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json", "run.trace.json"]


def test_trace_limit_caps_a_call_and_says_so(tmp_path):
    """Past --trace-limit events a call's open spans end (`capped`), an instant on its
    `call` track says so, and only its findings are marked from then on: a race at every
    one of 60 steps, all marked; the file's calls and the table's note say where it
    stopped."""
    trace = tmp_path / "run.trace.json"
    proc = run_cli(["run", "--races", "--trace", str(trace), "--trace-limit", "300",
                    "--format", "table", str(LONG_RACE), "--", "60"], timeout=300, cwd=ROOT)
    assert proc.returncode == ExitCode.FINDINGS, proc.stderr
    data = json.loads(trace.read_text())
    [call] = data["otherData"]["calls"]
    capped = call["capped"]
    assert capped["limit"] == 300 and 0 < capped["grid_steps"] < 60
    body = [e for e in data["traceEvents"] if e["ph"] != "M"]
    assert [e["ts"] for e in body] == sorted(e["ts"] for e in body)
    _spans(body)  # every span ended
    _check_flows(body)
    assert _grid_steps(data) == [[i] for i in range(capped["grid_steps"])]
    [note] = [e for e in body if e["ph"] == "i" and e["cat"] == "capped"]
    assert note["args"]["grid_steps"] == capped["grid_steps"]
    races = [e for e in body if e["ph"] == "i" and e["cat"] == "finding"]
    assert [r["args"]["grid_point"] for r in races] == [[i] for i in range(60)]
    assert len({r["args"]["finding"] for r in races}) == 1  # one defect, 60 sightings
    assert len(body) - len(races) < 300 + 10  # the cap, the spans it ended, its note
    table = " ".join(proc.stdout.split())
    assert (f"note: the trace of call 0 (racy_kernel) stops after {capped['grid_steps']}"
            " grid step(s), at --trace-limit 300 events; later, only its findings are"
            " marked") in table


def test_past_the_finding_marks_a_finding_is_seen_not_drawn(tmp_path, monkeypatch):
    """A call's findings past MAX_FINDING_MARKS get no instant, and are not taken for
    findings the timeline never saw (those are drawn after the call's end)."""
    from pallas_check.engine import timeline as timeline_module
    from pallas_check.findings.finding import Finding, FindingKind, KernelInfo, SourceFrame
    from pallas_check.report.trace import TraceWriter

    monkeypatch.setattr(timeline_module, "MAX_FINDING_MARKS", 3)
    writer = TraceWriter(tmp_path / "t.json", "k.py")
    timeline = timeline_module.Timeline("k", 0, seed=0, sink=writer.sink("k", 0, 0))
    found = [Finding(FindingKind.OUT_OF_BOUNDS, f"at line {line}", KernelInfo("k"), 0,
                     frames=(SourceFrame("k.py", line, "kernel", ""),), seed=0)
             for line in range(1, 6)]
    for finding in found:
        timeline.finding(finding)
    timeline.finish()
    writer.keep(timeline, found)
    writer.close(found, [])
    trace = json.loads((tmp_path / "t.json").read_text())
    marks = [e for e in trace["traceEvents"] if e.get("cat") == "finding"]
    assert [m["args"]["message"] for m in marks] == ["at line 1", "at line 2", "at line 3"]
    assert len({f["finding"] for f in trace["otherData"]["findings"]}) == 5


def _dma_events():
    from pallas_check.engine.events import Cell, DmaMoved, DmaStarted

    sem = Cell((7, (0,)), "sem", 0)
    return (DmaStarted(1, "dma 1", "core 0", 0, 0, "x", "buf", 512, (), None, sem, False,
                       False),
            DmaMoved(1, "dma 1", False, (), None), DmaMoved(1, "dma 1", True, (), sem))


def _dma_track(trace: dict) -> list[tuple[str, str]]:
    """The DMA's track as (phase, name): its begins, ends and arrow ends, in order."""
    tids = {e["tid"] for e in trace["traceEvents"]
            if e["ph"] == "M" and e["args"].get("name") == "DMA #1"}
    return [(e["ph"], e.get("name", "")) for e in trace["traceEvents"]
            if e["tid"] in tids and e["ph"] in "BEf"]


def test_a_stop_inside_a_moment_leaves_none_of_it(tmp_path, monkeypatch):
    """A stop raises wherever the run is: here, as the DMA lands, after its `sending`
    phase ended and its arrow from the start ended, before its `landed` phase began. The
    moment reaches the file whole or not at all: the DMA is left `sending`, ended
    unfinished, with no arrow landing (before, the arrow landed in the lifetime itself)."""
    from pallas_check.engine import timeline as timeline_module
    from pallas_check.report.trace import TraceWriter

    started, read, landed = _dma_events()
    whole = TraceWriter(tmp_path / "whole.json", "k.py")
    timeline = timeline_module.Timeline("k", 0, seed=0, sink=whole.sink("k", 0, 0))
    for event in (started, read, landed):
        getattr(timeline, f"on_{'dma_started' if event is started else 'dma_moved'}")(event)
    whole.close([], [])
    assert _dma_track(json.loads((tmp_path / "whole.json").read_text())) == [
        ("B", "DMA #1 x -> buf"), ("B", "queued"), ("E", ""), ("B", "sending"), ("E", ""),
        ("f", "DMA start -> landing"), ("B", "landed, not yet waited"), ("E", ""),
        ("E", "")]

    begin = timeline_module.Timeline._begin

    def stopped_at_landing(self, where, name, category, args=None):
        if name == "landed, not yet waited":
            raise KeyboardInterrupt
        begin(self, where, name, category, args)

    monkeypatch.setattr(timeline_module.Timeline, "_begin", stopped_at_landing)
    cut = TraceWriter(tmp_path / "cut.json", "k.py")
    timeline = timeline_module.Timeline("k", 0, seed=0, sink=cut.sink("k", 0, 0))
    timeline.on_dma_started(started)
    timeline.on_dma_moved(read)
    with pytest.raises(KeyboardInterrupt):
        timeline.on_dma_moved(landed)
    cut.close([], [])
    data = json.loads((tmp_path / "cut.json").read_text())
    assert _dma_track(data) == [("B", "DMA #1 x -> buf"), ("B", "queued"), ("E", ""),
                                ("B", "sending"), ("E", ""), ("E", "")]
    assert [e["args"] for e in data["traceEvents"] if e["ph"] == "E"][-2:] == [
        {"unfinished": True, "step": 0}, {"unfinished": True, "step": 0}]
