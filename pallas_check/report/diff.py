"""The report of `pallas-check diff`: a rich table per run, or JSON (versioned schema)."""

from __future__ import annotations

import json
import os
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from pallas_check.report.table import print_failures

from pallas_check import __version__

SCHEMA = "pallas-check/diff"
SCHEMA_VERSION = 1
TABLE_FIRST = 3  # mismatching elements shown per output in the table (JSON: all kept)
MATCHING_ROWS = 40  # beyond this many rows, matching outputs are only counted


def _number(x: float | None) -> Any:
    if x is None:
        return None
    return x if x == x and abs(x) != float("inf") else str(x)


def diff_dict(report: Any) -> dict[str, Any]:
    """The report as JSON-ready data; stable key order, no timestamps (reproducible)."""
    calls = []
    for c in report.calls:
        outputs = []
        for o in c.outputs:
            outputs.append({
                "output": o.output, "name": o.name, "shape": list(o.shape), "dtype": o.dtype,
                "size": o.size, "mismatches": o.mismatches, "max_abs": _number(o.max_abs),
                "max_rel": _number(o.max_rel), "rtol": o.rtol, "atol": o.atol,
                "note": o.note,
                "first_mismatches": [{"index": list(m.index), "ours": m.ours,
                                      "theirs": m.theirs} for m in o.first],
            })
        calls.append({"index": c.index, "device": c.device, "kernel": c.kernel,
                      "file": c.file, "line": c.line, "grid": list(c.grid),
                      "mismatches": c.mismatches, "error": c.error, "outputs": outputs})
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "pallas-check", "version": __version__},
        "script": report.script,
        "ours": report.config,
        "against": report.against,
        "against_config": report.against_config,
        "rtol": report.rtol,
        "atol": report.atol,
        "exit_code": report.exit_code,
        "partial": report.partial,
        "user_error": report.user_error,
        "user_traceback": report.user_traceback,
        "internal_error": report.internal_error,
        "summary": {
            "calls": len(report.calls),
            "outputs": sum(len(c.outputs) for c in report.calls),
            "mismatching_outputs": report.mismatching_outputs,
            "mismatching_elements": sum(c.mismatches for c in report.calls),
            "findings": report.findings,
        },
        "calls": calls,
    }


def _fmt(x: float) -> str:
    if x != x or abs(x) == float("inf"):
        return str(x)
    return f"{x:.3g}"


def render_table(report: Any, stream: TextIO) -> None:
    try:
        width = os.get_terminal_size(stream.fileno()).columns
    except (OSError, AttributeError, ValueError):
        width = 140
    console = Console(file=stream, width=max(100, width), highlight=False, soft_wrap=False)
    rows = [(c, o) for c in report.calls for o in c.outputs] + \
           [(c, None) for c in report.calls if c.error]
    rows.sort(key=lambda r: (r[0].index, r[0].device, -1 if r[1] is None else r[1].output))
    show_matching = len(rows) <= MATCHING_ROWS
    tol = ("per dtype" if report.rtol is None and report.atol is None
           else f"rtol={report.rtol}, atol={report.atol}")
    table = Table(title=f"pallas-check diff: ours vs {report.against} ({tol})",
                  title_justify="left", show_lines=True, expand=True)
    for col in ("call", "kernel", "output", "shape", "dtype", "mismatches", "max abs",
                "max rel", "first mismatches (index: ours vs theirs)"):
        table.add_column(col, overflow="fold")
    hidden = 0
    for c, o in rows:
        call = f"{c.index}" + (f" (device {c.device})" if c.device else "")
        kernel = f"{c.kernel}\n{os.path.basename(c.file)}:{c.line}"
        if o is None:
            table.add_row(call, kernel, "", "", "", Text("not compared", style="bold red"),
                          "", "", Text(c.error or ""))
            continue
        if not o.mismatches and not show_matching:
            hidden += 1
            continue
        count = Text(f"{o.mismatches} of {o.size}" if o.mismatches else "0",
                     style="bold red" if o.mismatches else "green")
        first = "\n".join(f"{list(m.index)}: {m.ours} vs {m.theirs}"
                          for m in o.first[:TABLE_FIRST])
        if o.mismatches > TABLE_FIRST:
            first += "\n…"
        if o.note:
            first = (first + "\n" if first else "") + o.note
        table.add_row(call, kernel, o.name, str(tuple(o.shape)), o.dtype, count,
                      _fmt(o.max_abs), _fmt(o.max_rel), first)
    if rows:
        console.print(table)
    if hidden:
        console.print(Text(f"{hidden} matching output(s) not shown.", style="dim"))
    if report.findings:
        console.print(Text(f"Our run also reported {report.findings} finding(s);"
                           f" `pallas-check run` shows them.", style="yellow"))
    print_failures(console, report.user_error, report.user_traceback,
                   report.internal_error)
    outputs = sum(len(c.outputs) for c in report.calls)
    bad = report.mismatching_outputs
    summary = (f"{bad} of {outputs} output(s) differ in {len(report.calls)} pallas_call(s)"
               f" (ours vs {report.against})")
    if report.partial:
        summary += " (partial: the run did not finish)"
    console.print(Text("pallas-check: ", style="bold")
                  + Text(summary, style="bold red" if bad else "bold green"))


def render(report: Any, fmt: str, stream: TextIO) -> None:
    if fmt == "json":
        json.dump(diff_dict(report), stream, indent=2, default=str)
        stream.write("\n")
    elif fmt == "table":
        render_table(report, stream)
    else:
        raise ValueError(f"unknown report format {fmt!r}")


__all__ = ["diff_dict", "render"]
