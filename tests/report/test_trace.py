"""`--trace FILE`: the timeline of every concurrency sample as Chrome trace-event JSON.

`check_trace` checks what README's "Timeline" section documents: the schema, events in time
order, every span (grid step, blocked wait, DMA lifetime and phase) begun and ended on its
track, each process and track named before its first event, every flow arrow with one
start and at most one end after it, every DMA's events paired, an instant per finding
(carrying its message, found through otherData.findings) inside the grid step, or the DMA's
lifetime, where it was found, and, for a deadlock, every blocked actor still blocked at the
end.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import pytest

from _cli_worker import run_cli
from scenarios.test_samples import BUGS, OKS, expectations, run_args

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "samples"
# Found by the checks at the kernel's end, not at a step.
END_OF_CALL = {"semaphore-leak", "dma-not-waited", "unwritten-output"}
_CONCURRENT = re.compile(r"--races|--devices|--cores|--dma random")


def _concurrency_samples() -> list[tuple[Path, str]]:
    """Bug samples of races and deadlocks, or needing several cores, devices or DMA
    actors (with the args of their first such expectation), and their fixed twins."""
    found = []
    for path in BUGS:
        for want in expectations(path):
            args = want.get("args", "")
            if want["kind"] in ("race", "deadlock") or _CONCURRENT.search(args):
                found.append((path, args))
                break
    found += [(p, run_args(p)) for p in OKS if _CONCURRENT.search(run_args(p))]
    return found


CASES = _concurrency_samples()


def _run(path: Path, args: str, tmp_path: Path) -> tuple[int, dict, dict, str]:
    trace, report = tmp_path / "run.trace.json", tmp_path / "report.json"
    proc = run_cli(
        ["run", *args.split(), "--trace", str(trace),
         "--format", "json", "--output", str(report), str(path)],
        timeout=300, cwd=ROOT)
    assert trace.exists(), proc.stderr
    return (proc.returncode, json.loads(trace.read_text()), json.loads(report.read_text()),
            proc.stderr)


def _spans(events: list[dict]) -> dict[tuple[int, int], list[tuple[dict, dict]]]:
    """Per track, the (begin, end) pairs; asserts each E closes the innermost open B."""
    open_: dict[tuple[int, int], list[dict]] = defaultdict(list)
    spans: dict[tuple[int, int], list[tuple[dict, dict]]] = defaultdict(list)
    for event in events:
        track = (event["pid"], event["tid"])
        if event["ph"] == "B":
            open_[track].append(event)
        elif event["ph"] == "E":
            assert open_[track], f"an end with no begin on {track} at {event['ts']}"
            spans[track].append((open_[track].pop(), event))
    assert not any(open_.values()), "spans left open"
    return spans


def check_trace(trace: dict, report: dict) -> None:
    assert trace["otherData"]["schema"] == "pallas-check/trace"
    assert trace["otherData"]["schema_version"] == 2
    assert trace["otherData"]["time"].startswith("logical")
    events = trace["traceEvents"]
    body = [e for e in events if e["ph"] != "M"]
    assert {e["ph"] for e in body} <= {"B", "E", "i", "s", "f"}
    for e in body:
        assert isinstance(e["ts"], int) and e["ts"] >= 0
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] != "E":
            assert isinstance(e["name"], str) and e["name"] and isinstance(e["cat"], str)
    assert [e["ts"] for e in body] == sorted(e["ts"] for e in body), "events out of order"
    names: dict[tuple[int, int], str] = {}
    processes = {}
    for e in events:  # a process and a track are named before their first event
        if e["ph"] != "M":
            assert e["pid"] in processes and (e["pid"], e["tid"]) in names, e
        elif e["name"] == "thread_name":
            assert (e["pid"], e["tid"]) not in names, "a track named twice"
            names[(e["pid"], e["tid"])] = e["args"]["name"]
        elif e["name"] == "process_name":
            match = re.fullmatch(r"call (\d+): \S+ - device (\d+)", e["args"]["name"])
            assert match, e["args"]["name"]
            processes[e["pid"]] = (int(match.group(1)), int(match.group(2)))
    spans = _spans(body)
    _check_flows(body)
    _check_dmas(body, spans, names)
    _check_findings(body, spans, names, report, processes, trace["otherData"]["findings"])


def _check_flows(body: list[dict]) -> None:
    """Each arrow starts once, where its source is; it ends once, later, or never (a
    signal no wait consumed, a DMA that never landed)."""
    flows: dict[int, list[dict]] = defaultdict(list)
    for e in body:
        if e["ph"] in "sf":
            flows[e["id"]].append(e)
    for flow_id, pair in flows.items():
        assert [e["ph"] for e in pair] in (["s", "f"], ["s"]), f"flow {flow_id}: {pair}"
        assert pair[0]["ts"] <= pair[-1]["ts"]
        assert pair[0]["name"] == pair[-1]["name"] in ("signal -> wait",
                                                       "DMA start -> landing")


def _check_dmas(body: list[dict], spans: dict, names: dict) -> None:
    """A DMA's track: one lifetime slice holding its phases in order, and the arrow from
    its start landing inside it."""
    for track, name in names.items():
        if not name.startswith("DMA #"):
            continue
        mine = spans[track]
        lifetimes = [(b, e) for b, e in mine if b["cat"] == "dma"]
        assert len(lifetimes) == 1, f"{name}: {len(lifetimes)} lifetimes"
        begin, end = lifetimes[0]
        assert begin["name"].startswith(name + " ")
        phases = sorted(((b, e) for b, e in mine if b["cat"] == "dma-phase"),
                        key=lambda s: s[0]["ts"])
        wanted = ["queued", "sending", "landed, not yet waited"]
        # (a stopped run's DMA is as far as it got: each moment is in the file whole, so
        # it is at least queued, and has its landing arrow only once it landed)
        assert [b["name"] for b, _ in phases] == wanted[:len(phases)], name
        assert phases, name
        for (b, e) in phases:
            assert begin["ts"] < b["ts"] and e["ts"] < end["ts"]
        landings = [e for e in body if (e["pid"], e["tid"]) == track and e["ph"] == "f"
                    and e["name"] == "DMA start -> landing"]
        assert len(landings) == (1 if len(phases) == 3 else 0), name
        waited = "waited_by" in end["args"]
        assert waited != bool(end["args"].get("unfinished")), name


# The tracks of actors running kernel code: TensorCores (`core 0`) and SparseCore subcores
# (`sparsecore 0 subcore 3`, `sparsecore 0 scalar subcore`); the others are DMAs and copies.
KERNEL_TRACKS = ("core", "sparsecore")


def _check_findings(body: list[dict], spans: dict, names: dict, report: dict,
                    processes: dict, index: list[dict]) -> None:
    """Every finding of the report has an instant (its first sighting, where it was found)
    by its `finding` id, which otherData.findings gives."""
    assert [i["finding_index"] for i in index] == list(range(len(index)))
    assert len(index) == len(report["findings"])  # (suppressed ones too, last)
    instants = [e for e in body if e["ph"] == "i" and e["cat"] == "finding"]
    for position, finding in enumerate(report["findings"]):
        assert index[position]["suppressed"] == (finding["suppressed"] or {}).get("by")
        mine = [e for e in instants if e["args"]["finding"] == index[position]["finding"]]
        assert mine, (position, finding["kind"])
        assert all(e["args"]["kind"] == finding["kind"] for e in mine)
        instant = mine[0]
        # (the instant is written as the finding is made; judging it by what the program
        # keeps, after the jitted call around the kernel, may add to the report's message)
        assert finding["message"].startswith(instant["args"]["message"])
        if instant["args"].get("after_simulation"):
            assert names[(instant["pid"], instant["tid"])] == "call"
            continue
        track = (instant["pid"], instant["tid"])
        around = [b for b, e in spans[track] if b["ts"] < instant["ts"] < e["ts"]]
        if finding["kind"] in END_OF_CALL:  # found when the kernel ended: after every step
            last_step = max(e["ts"] for t, pairs in spans.items() if t[0] == track[0]
                            for b, e in pairs if b["cat"] == "grid-step")
            assert not around and instant["ts"] > last_step, finding["kind"]
        elif names[track].startswith(KERNEL_TRACKS):
            steps = [b["args"]["grid_point"] for b in around if b["cat"] == "grid-step"]
            if finding["kind"] == "deadlock":
                # Where the first blocked actor stopped (the finding's own grid_point is
                # the first core's, whichever actor blocked first).
                assert len(steps) == 1, steps
            else:
                assert steps == [finding["grid_point"]], (finding["kind"], steps)
        else:
            assert any(b["cat"] == "dma" for b in around), finding["kind"]
        if finding["kind"] == "deadlock":
            _check_deadlock(instant, finding, spans, names, processes)


def _check_deadlock(instant: dict, finding: dict, spans: dict, names: dict,
                    processes: dict) -> None:
    """Every actor the deadlock names is blocked from before the finding to the end."""
    call = processes[instant["pid"]][0]
    for access in finding["accesses"]:
        words = access["actor"].split()  # "core 0" or "device 1 core 0"
        device = int(words[1]) if words[0] == "device" else 0
        pid = next(p for p, (c, d) in processes.items() if c == call and d == device)
        track = next(t for t, n in names.items() if t[0] == pid and n == " ".join(words[-2:]))
        blocked = [(b, e) for b, e in spans[track] if b["cat"] == "blocked"
                   and b["ts"] < instant["ts"] < e["ts"]]
        assert blocked and blocked[-1][1]["args"].get("unfinished"), access["actor"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0].stem)
def test_every_concurrency_sample_has_a_valid_trace(case, tmp_path):
    path, args = case
    code, trace, report, stderr = _run(path, args, tmp_path)
    assert code == (1 if path.stem.endswith("_bug") else 0), stderr
    assert report["trace"] and report["trace"].endswith("run.trace.json")
    check_trace(trace, report)
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    tracks = [e["args"]["name"] for e in meta if e["name"] == "thread_name"]
    assert any(t.startswith(KERNEL_TRACKS) for t in tracks)
    processes = [e for e in meta if e["name"] == "process_name"]
    devices = re.search(r"--devices (\d+)", args)
    calls = {e["args"]["name"].split(" - ")[0] for e in processes}
    assert len(processes) == len(calls) * (int(devices.group(1)) if devices else 1)


def test_a_deadlock_shows_every_blocked_actor(tmp_path):
    code, trace, report, _ = _run(SAMPLES / "remote_deadlock_bug.py", "--devices 2",
                                  tmp_path)
    assert code == 1
    (deadlock,) = [f for f in report["findings"] if f["kind"] == "deadlock"]
    assert len(deadlock["accesses"]) == 2  # both devices wait
    blocked = [e for e in trace["traceEvents"] if e["ph"] == "B" and e["cat"] == "blocked"]
    assert len({e["pid"] for e in blocked}) == 2
    check_trace(trace, report)


def test_the_table_points_at_the_trace(cli, tmp_path):
    trace = tmp_path / "run.trace.json"
    result = cli("run", "--cores", "2", "--races", "--trace", str(trace), "--format", "table",
                 str(SAMPLES / "two_core_accumulate_bug.py"), json_report=False)
    assert result.exit_code == 1
    # The note may wrap between words at the width (a long tmp path on its own line).
    assert f"timeline: open {trace} in ui.perfetto.dev" in " ".join(result.output.split())
    # docs/draw_trace.py (README's picture) draws it: the race in red on a core's row.
    import importlib.util
    import xml.dom.minidom

    spec = importlib.util.spec_from_file_location("draw_trace", ROOT / "docs" / "draw_trace.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    svg = module.draw(json.loads(trace.read_text()))
    xml.dom.minidom.parseString(svg)
    assert 'fill="red" font-weight="bold">race: o_ref</text>' in svg
    assert "partial_sum_kernel - device 0 / core 1" in svg
    plain = cli("run", "--cores", "2", "--races", "--format", "table",
                str(SAMPLES / "two_core_accumulate_bug.py"), json_report=False)
    assert "ui.perfetto.dev" not in plain.output


def test_trace_needs_a_file_and_keeps_the_script(cli):
    script = SAMPLES / "add_ok.py"
    to_stdout = cli("run", "--trace", "-", str(script))
    assert to_stdout.exit_code == 2 and "--trace needs a file" in to_stdout.output
    itself = cli("run", "--trace", str(script), str(script))
    assert itself.exit_code == 2 and "--trace" in itself.output
    assert script.read_text().startswith('"""A correct')


def test_a_finding_the_timeline_did_not_see_is_marked_after_the_simulation(tmp_path):
    """Uninitialized values reaching an output (two fills compared) or, with --keep-going,
    a finding seen only under another seed: an instant on the call's track, after the end."""
    from pallas_check.engine.timeline import Timeline
    from pallas_check.findings.finding import Finding, FindingKind, KernelInfo
    from pallas_check.report.trace import TraceWriter

    writer = TraceWriter(tmp_path / "t.json", "k.py")
    timeline = Timeline("k", 0, seed=0, sink=writer.sink("k", 0, 0))
    seen = Finding(FindingKind.OUT_OF_BOUNDS, "seen", KernelInfo("k"), 0, seed=0)
    timeline.finding(seen)
    timeline.finish()
    later = Finding(FindingKind.RACE, "under seed 4", KernelInfo("k"), 0, seed=4)
    writer.keep(timeline, [seen, later])
    writer.close([seen, later], [])
    trace = json.loads((tmp_path / "t.json").read_text())
    marks = [e for e in trace["traceEvents"] if e.get("cat") == "finding"]
    assert [(m["args"]["message"], m["args"].get("after_simulation"), m["args"]["seed"]
             if "seed" in m["args"] else None) for m in marks] == [
        ("seen", None, None), ("under seed 4", True, 4)]
    assert marks[1]["ts"] > marks[0]["ts"]
    assert [(f["finding"], f["finding_index"]) for f in trace["otherData"]["findings"]] == [
        (marks[0]["args"]["finding"], 0), (marks[1]["args"]["finding"], 1)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]  # no temporary file
