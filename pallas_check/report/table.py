"""Rich tables for a terminal: one table per finding kind, with the user's source line."""

from __future__ import annotations

import os
from collections import defaultdict
from typing import TextIO

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from pallas_check.findings import Finding, FindingKind, SourceFrame, format_range
from pallas_check.report.model import RunReport, replay_command, suppressed_text
from pallas_check.report.paths import display_path, display_text

_TITLES = {
    FindingKind.OUT_OF_BOUNDS: "Out-of-bounds accesses",
    FindingKind.UNINITIALIZED: "Uninitialized memory reaching outputs",
    FindingKind.UNWRITTEN_OUTPUT: "Output elements never written",
    FindingKind.OUTPUT_REVISITED: "Output blocks revisited",
    FindingKind.SEMAPHORE_LEAK: "Semaphore leaks",
    FindingKind.DMA_NOT_WAITED: "DMAs never waited",
    FindingKind.RACE: "Data races",
    FindingKind.DEADLOCK: "Deadlocks",
    FindingKind.UNUSED_SUPPRESSION: "Suppressions that matched nothing",
    FindingKind.COMPILE_ERROR: "TPU compile errors (--compile)",
    FindingKind.VMEM_EXCEEDED: "VMEM overflows (--compile)",
}



def _where(frame: SourceFrame | None) -> Text:
    """file:line only; the source line itself is printed under the table, unwrapped."""
    if frame is None:
        return Text("?")
    return Text(f"{display_path(frame.file)}:{frame.line}", style="cyan")


def _print_source(console: Console, index: int, f: Finding) -> None:
    """`#n file:line` and the user's source line, never folded, so it can be copied."""
    frame = f.location
    if frame is None:
        return
    console.print(Text(f"  #{index} ", style="bold") + _where(frame), soft_wrap=True)
    if frame.code:
        console.print(Text(f"      {frame.code}", style="bold"), soft_wrap=True)


def _buffer(f: Finding) -> str:
    return f.buffer + format_range(f.index_range)


def _message(f: Finding) -> str:
    """The finding's message, with in how many explored schedules it appeared."""
    message = display_text(f.message)
    schedules = f.details.get("schedules")
    if schedules:
        message += f" (in {schedules[0]} of {schedules[1]} schedules tried)"
    return message


def _row(index: int, f: Finding) -> list[Text | str]:
    buffer = _buffer(f)
    if f.memory_space:
        buffer += f"\n({f.memory_space})"
    grid = "" if f.grid_point is None else str(tuple(f.grid_point))
    count = f"×{f.count}" if f.count > 1 else ""
    return [str(index), f"{f.kernel.name}\ncall {f.call_index}", buffer, grid,
            _where(f.location), Text(_message(f)), count]


class TableReporter:
    def __init__(self, ascii_only: bool = False, width: int | None = None) -> None:
        self.ascii_only = ascii_only
        self.width = width  # the columns of the terminal it is shown on (None: a file)

    def render(self, report: RunReport, stream: TextIO) -> None:
        width = self.width if self.width is not None else _width(stream)
        console = Console(file=stream, width=max(60, width), highlight=False,
                          soft_wrap=False, emoji=False, legacy_windows=False)
        call_sites = {c.index: c.call_site for c in report.calls
                      if getattr(c, "call_site", None) is not None}
        groups: dict[FindingKind, list[Finding]] = defaultdict(list)
        for f in report.findings:
            groups[f.kind].append(f)
        n = 0
        for kind in FindingKind:
            items = groups.get(kind)
            if not items:
                continue
            first = n + 1
            n += len(items)
            if width >= WIDE:
                console.print(self._table(kind, items, first, width))
            else:
                _print_blocks(console, kind, items, first)
            for index, f in enumerate(items, start=first):
                _print_source(console, index, f)
                site = call_sites.get(f.call_index)
                if site is not None:
                    console.print(Text("      called from ", style="dim") + _where(site)
                                  + Text(f"  {site.code}" if site.code else ""),
                                  soft_wrap=True)
                if f.accesses and kind in (FindingKind.UNINITIALIZED, FindingKind.RACE,
                                           FindingKind.DEADLOCK):
                    _print_accesses(console, f)
                console.print(Text("      replay: ", style="dim")
                                  + Text(replay_command(report.script, report.config, f.seed,
                                                       report.rerun, report.script_args)),
                                  soft_wrap=True)
                if report.trace and kind in (FindingKind.RACE, FindingKind.DEADLOCK):
                    console.print(Text("      timeline: ", style="dim")
                                  + Text(f"open {report.trace} in ui.perfetto.dev"),
                                  soft_wrap=True)
        _print_compiled(console, report)
        print_failures(console, report.user_error, report.user_traceback,
                       report.internal_error)
        summary = summary_line(report)
        style = "bold green" if not report.findings else "bold red"
        console.print(Text("pallas-check: ", style="bold") + Text(summary, style=style),
                      soft_wrap=True)


    def _table(self, kind: FindingKind, items: list[Finding], first: int,
               width: int) -> Table:
        table = Table(title=f"{_TITLES[kind]} ({len(items)})", title_justify="left",
                      show_lines=True, expand=True,
                      box=box.ASCII if self.ascii_only else box.HEAVY_HEAD)
        # Flexible (ratio) columns ignore min_width in rich: the kernel column is sized by
        # its content (never narrower than its header), folded only when very long.
        name_width = min(24, max(len("kernel"), *(len(f.kernel.name) for f in items)))
        # file:line and the buffer's range are not folded mid-token: their columns are as
        # wide as their longest entry (within reason).
        where_width = min(max(20, width // 3),
                          max(len(_where(f.location).plain) for f in items))
        buffer_width = min(max(16, width // 4),
                           max(len("buffer"), *(len(_buffer(f)) for f in items)))
        for col, ratio in (("#", 0), ("kernel", 0), ("buffer", 2), ("grid point", 1),
                           ("where", 3), ("what", 5), ("count", 0)):
            fixed = {"kernel": name_width, "where": where_width,
                     "buffer": buffer_width}.get(col)
            table.add_column(col, ratio=None if fixed else ratio or None,
                             overflow="fold", min_width=fixed, max_width=fixed)
        for index, f in enumerate(items, start=first):
            table.add_row(*_row(index, f))
        return table


WIDE = 110  # narrower terminals get one block per finding instead of a table


def _print_blocks(console: Console, kind: FindingKind, items: list[Finding],
                  first: int) -> None:
    """Findings for a narrow terminal: a heading line per finding, then its message."""
    console.print(Text(f"{_TITLES[kind]} ({len(items)})", style="bold"))
    for index, f in enumerate(items, start=first):
        head = Text(f"#{index} ", style="bold") + _where(f.location) + Text(
            f"  {f.kernel.name} (call {f.call_index})  {_buffer(f)}")
        if f.memory_space:
            head += Text(f" ({f.memory_space})")
        if f.grid_point is not None:
            head += Text(f"  grid point {tuple(f.grid_point)}")
        if f.count > 1:
            head += Text(f"  ×{f.count}")
        console.print(head)
        console.print(Text(_message(f)), overflow="fold")
    console.print()


def _print_compiled(console: Console, report: RunReport) -> None:
    """`--compile`: each call's VMEM per TPU generation (scoped use of the scoped limit,
    plus scratch), or why it did not build, so the headroom shows before it is gone."""
    calls = [c for c in report.calls if getattr(c, "compiled", None)]
    if not calls:
        return
    console.print(Text("VMEM per call and TPU generation (--compile):", style="bold"))
    for call in calls:
        parts = []
        for generation, entry in call.compiled.items():
            if entry["status"] != "ok":
                code = f" {entry['error_code']}" if entry.get("error_code") else ""
                parts.append(f"{generation} {entry['status']}{code}")
                continue
            text = (f"{generation} {_mib(entry['vmem_scoped_bytes'])} of"
                    f" {_mib(entry['vmem_scoped_limit_bytes'])}")
            if entry.get("vmem_scratch_bytes"):
                text += f" + scratch {_mib(entry['vmem_scratch_bytes'])}"
            parts.append(text)
        console.print(Text(f"  call {call.index} {call.kernel}: " + "; ".join(parts)),
                      soft_wrap=True)


def _mib(nbytes: int | None) -> str:
    return "?" if nbytes is None else f"{nbytes / (1024 * 1024):.2f} MiB"


def summary_line(report: RunReport) -> str:
    """`N findings in M pallas_calls`, saying so when nothing was checked or the run
    did not finish."""
    calls = sum(1 for c in report.calls if not getattr(c, "failed", False))
    if report.internal_error:
        summary = (f"stopped by an error of pallas-check after {calls}"
                   f" pallas_call{'s' if calls != 1 else ''};"
                   f" {len(report.findings)} finding{'s' if len(report.findings) != 1 else ''}"
                   " until then")
    elif calls == 0 and report.partial:
        summary = "no pallas_call was checked before the run stopped"
    elif calls == 0:
        summary = ("no pallas_call was checked: the script made none"
                   " (or its calls never ran)")
    else:
        summary = (f"{len(report.findings)} finding{'s' if len(report.findings) != 1 else ''}"
                   f" in {calls} pallas_call{'s' if calls != 1 else ''}")
    if report.suppressed:
        summary += f"; {suppressed_text(report)}"
    if report.partial:
        stopped = "".join(
            f"; call {c.index} ({c.kernel}) stopped {c.stopped_text()}" for c in report.calls if getattr(c, "interrupted", False))
        summary += f" (partial: the run did not finish{stopped})"
    return summary


def print_failures(console: Console, user_error: str | None, user_traceback: str | None,
                   internal_error: str | None) -> None:
    """The script's failure (with its traceback) and pallas-check's own, if any."""
    if user_error:
        console.print(Text("The script failed: ", style="bold red") + Text(user_error),
                      soft_wrap=True)
        if user_traceback:
            console.print(Text(user_traceback.rstrip()), soft_wrap=True)
    if internal_error:
        console.print(Text("pallas-check error: ", style="bold red") + Text(internal_error),
                      soft_wrap=True)


def _print_accesses(console: Console, f: Finding) -> None:
    console.print(Text(f"  {f.kind.value} in {f.kernel.name}: accesses involved", style="dim"))
    labels = ("current:  ", "previous: ") if f.kind == FindingKind.RACE else ("", "")
    for i, a in enumerate(f.accesses):
        label = labels[i] if i < len(labels) else ""
        where = a.frames[0] if a.frames else None
        loc = f"{display_path(where.file)}:{where.line}  {where.code}" if where else "?"
        grid = f" at grid point {tuple(a.grid_point)}" if a.grid_point is not None else ""
        console.print(display_text(
            f"    {label}{a.operation} {a.buffer}{format_range(a.index_range)} by {a.actor}"
            f"{grid}: {loc}"), highlight=False, markup=False, soft_wrap=True)


def _width(stream: TextIO) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, AttributeError, ValueError):
        return 120  # a file or a pipe: wide enough for the columns, narrow enough to read
