"""Draw a pallas-check trace (`--trace FILE`) as a small SVG, for the README.

    python docs/draw_trace.py run.trace.json docs/race-timeline.svg

Plain Python (no plotting library): one row per track (process / core or DMA), slices as
bars (grid steps grey, blocked waits orange, DMA phases blue), instants as ticks, flow arrows
as lines, findings in red with their kind. The full picture is in ui.perfetto.dev; this is
a still of it.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from html import escape

COLORS = {"grid-step": "#d9d9d9", "blocked": "#f4a261", "dma": "#cfe2f3",
          "dma-phase": "#6fa8dc"}
ROW, LEFT, WIDTH = 34, 250, 900


def _rows(events: list[dict]) -> dict[tuple[int, int], tuple[int, str]]:
    procs = {e["pid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "process_name"}
    threads = sorted((e["pid"], e["tid"], e["args"]["name"]) for e in events
                     if e["ph"] == "M" and e["name"] == "thread_name")
    return {(pid, tid): (i, f"{procs[pid].split(': ', 1)[-1]} / {name}")
            for i, (pid, tid, name) in enumerate(threads)}


def draw(trace: dict) -> str:
    events = trace["traceEvents"]
    rows = _rows(events)
    body = [e for e in events if e["ph"] != "M"]
    end = max(e["ts"] for e in body) + 1
    x = lambda ts: LEFT + ts * WIDTH / end  # noqa: E731
    y = lambda track, depth=0: 30 + rows[track][0] * ROW + depth * 6  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{LEFT + WIDTH + 20}"'
           f' height="{60 + len(rows) * ROW}" font-family="monospace" font-size="11">',
           '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="{LEFT}" y="16">logical time (scheduler steps and events) &#8594;</text>']
    for track, (_, label) in rows.items():
        out.append(f'<text x="4" y="{y(track) + 16}">{escape(label)}</text>')
    stacks: dict[tuple, list[dict]] = defaultdict(list)
    flows: dict[int, dict] = {}
    bars: list[tuple[int, str]] = []  # (depth, svg): outer bars are drawn first
    top: list[str] = []  # arrows and findings, over the bars
    for e in body:
        track = (e["pid"], e["tid"])
        if e["ph"] == "B":
            stacks[track].append(e)
        elif e["ph"] == "E":
            b = stacks[track].pop()
            depth = len(stacks[track])
            bars.append((depth, f'<rect x="{x(b["ts"]):.1f}" y="{y(track, depth):.1f}"'
                       f' width="{max(1.0, x(e["ts"]) - x(b["ts"])):.1f}"'
                       f' height="{ROW - 8 - depth * 6}" fill="{COLORS.get(b["cat"], "#eee")}"'
                       f' stroke="#666" stroke-width="0.5"><title>{escape(b["name"])}</title>'
                       '</rect>'))
            if b["cat"] in ("grid-step", "blocked") and x(e["ts"]) - x(b["ts"]) > 60:
                bars.append((depth, f'<text x="{x(b["ts"]) + 3:.1f}"'
                                    f' y="{y(track, depth) + 11:.1f}">'
                                    f'{escape(b["name"][:28])}</text>'))
        elif e["ph"] == "s":
            flows[e["id"]] = e
        elif e["ph"] == "f" and e["id"] in flows:
            s = flows.pop(e["id"])
            top.append(f'<line x1="{x(s["ts"]):.1f}" y1="{y((s["pid"], s["tid"])) + 20:.1f}"'
                       f' x2="{x(e["ts"]):.1f}" y2="{y(track) + 20:.1f}" stroke="#3c78d8"'
                       ' stroke-width="1.2" marker-end="url(#arrow)"/>')
        elif e["ph"] == "i" and e["cat"] == "finding":
            top.append(f'<line x1="{x(e["ts"]):.1f}" y1="{y(track) - 4:.1f}"'
                       f' x2="{x(e["ts"]):.1f}" y2="{y(track) + ROW - 4:.1f}" stroke="red"'
                       f' stroke-width="2.5"><title>{escape(e["args"]["message"])}</title>'
                       '</line>')
            top.append(f'<text x="{x(e["ts"]) + 4:.1f}" y="{y(track) + 28:.1f}" fill="red"'
                       f' font-weight="bold">{escape(e["name"])}</text>')
    out.insert(1, '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5"'
                  ' markerWidth="6" markerHeight="6" orient="auto"><path d="M0,0 L10,5 L0,10z"'
                  ' fill="#3c78d8"/></marker></defs>')
    out += [svg for _, svg in sorted(bars, key=lambda bar: bar[0])] + top
    out.append("</svg>")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as handle:
        svg = draw(json.load(handle))
    with open(sys.argv[2], "w", encoding="utf-8") as handle:
        handle.write(svg)
