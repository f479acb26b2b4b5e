"""Rich tables for a terminal: one table per finding kind, with the user's source line."""

from __future__ import annotations

import os
from collections import defaultdict
from typing import TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from pallas_check.findings import Finding, FindingKind, SourceFrame, format_range
from pallas_check.report.model import RunReport, replay_command

_TITLES = {
    FindingKind.OUT_OF_BOUNDS: "Out-of-bounds accesses",
    FindingKind.UNINITIALIZED: "Uninitialized memory reaching outputs",
    FindingKind.UNWRITTEN_OUTPUT: "Output elements never written",
    FindingKind.OUTPUT_REVISITED: "Output blocks revisited",
    FindingKind.SEMAPHORE_LEAK: "Semaphore leaks",
    FindingKind.DMA_NOT_WAITED: "DMAs never waited",
    FindingKind.RACE: "Data races",
    FindingKind.DEADLOCK: "Deadlocks",
}


def _path(file: str) -> str:
    try:
        rel = os.path.relpath(file)
        if not rel.startswith(".."):
            return rel
    except ValueError:
        pass
    return file


def _where(frame: SourceFrame | None) -> Text:
    """file:line only; the source line itself is printed under the table, unwrapped."""
    if frame is None:
        return Text("?")
    return Text(f"{_path(frame.file)}:{frame.line}", style="cyan")


def _print_source(console: Console, index: int, f: Finding) -> None:
    """`#n file:line` and the user's source line, never folded, so it can be copied."""
    frame = f.location
    if frame is None:
        return
    console.print(Text(f"  #{index} ", style="bold") + _where(frame), soft_wrap=True)
    if frame.code:
        console.print(Text(f"      {frame.code}", style="bold"), soft_wrap=True)


def _row(index: int, f: Finding) -> list[Text | str]:
    buffer = f.buffer + format_range(f.index_range)
    if f.memory_space:
        buffer += f" ({f.memory_space})"
    grid = "" if f.grid_point is None else str(tuple(f.grid_point))
    count = f"×{f.count}" if f.count > 1 else ""
    return [str(index), f"{f.kernel.name}\ncall {f.call_index}", buffer, grid,
            _where(f.location), Text(f.message), count]


class TableReporter:
    def render(self, report: RunReport, stream: TextIO) -> None:
        console = Console(file=stream, width=max(100, _width(stream)), highlight=False,
                          soft_wrap=False)
        groups: dict[FindingKind, list[Finding]] = defaultdict(list)
        for f in report.findings:
            groups[f.kind].append(f)
        n = 0
        for kind in FindingKind:
            items = groups.get(kind)
            if not items:
                continue
            table = Table(title=f"{_TITLES[kind]} ({len(items)})", title_justify="left",
                          show_lines=True, expand=True)
            # Flexible (ratio) columns ignore min_width in rich: the kernel column is sized
            # by its content, so a name is folded only when it is very long.
            name_width = min(24, max(len(f.kernel.name) for f in items))
            for col, ratio in (("#", 0), ("kernel", 0), ("buffer", 2), ("grid point", 1),
                               ("where", 3), ("what", 5), ("count", 0)):
                table.add_column(col, ratio=ratio or None, overflow="fold",
                                 max_width=name_width if col == "kernel" else None)
            first = n + 1
            for f in items:
                n += 1
                table.add_row(*_row(n, f))
            console.print(table)
            for index, f in enumerate(items, start=first):
                _print_source(console, index, f)
                if f.accesses and kind in (FindingKind.UNINITIALIZED, FindingKind.RACE,
                                           FindingKind.DEADLOCK):
                    _print_accesses(console, f)
                if kind in (FindingKind.RACE, FindingKind.DEADLOCK) or _explores(report):
                    console.print(Text("      replay: ", style="dim")
                                  + Text(replay_command(report.script, report.config, f.seed,
                                                       report.rerun, report.script_args)),
                                  soft_wrap=True)
        print_failures(console, report.user_error, report.user_traceback,
                       report.internal_error)
        calls = len(report.calls)
        summary = (f"{len(report.findings)} finding{'s' if len(report.findings) != 1 else ''}"
                   f" in {calls} pallas_call{'s' if calls != 1 else ''}")
        if report.partial:
            summary += " (partial: the run did not finish)"
        style = "bold green" if not report.findings else "bold red"
        console.print(Text("pallas-check: ", style="bold") + Text(summary, style=style))


def print_failures(console: Console, user_error: str | None, user_traceback: str | None,
                   internal_error: str | None) -> None:
    """The script's failure (with its traceback) and pallas-check's own, if any."""
    if user_error:
        console.print(Text("The script failed: ", style="bold red") + Text(user_error))
        if user_traceback:
            console.print(Text(user_traceback.rstrip()))
    if internal_error:
        console.print(Text("pallas-check error: ", style="bold red") + Text(internal_error))


def _explores(report: RunReport) -> bool:
    return report.config.get("schedules", 1) > 1 or report.config.get("dma_mode") == "random"


def _print_accesses(console: Console, f: Finding) -> None:
    console.print(Text(f"  {f.kind.value} in {f.kernel.name}: accesses involved", style="dim"))
    labels = ("current:  ", "previous: ") if f.kind == FindingKind.RACE else ("", "")
    for i, a in enumerate(f.accesses):
        label = labels[i] if i < len(labels) else ""
        where = a.frames[0] if a.frames else None
        loc = f"{_path(where.file)}:{where.line}  {where.code}" if where else "?"
        grid = f" at grid point {tuple(a.grid_point)}" if a.grid_point is not None else ""
        console.print(f"    {label}{a.operation} {a.buffer}{format_range(a.index_range)} by {a.actor}"
                      f"{grid}: {loc}", highlight=False, markup=False, soft_wrap=True)


def _width(stream: TextIO) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, AttributeError, ValueError):
        return 140
