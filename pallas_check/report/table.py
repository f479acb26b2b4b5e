"""The report for people: a table per finding kind when the terminal is wide enough for
every cell at its content's width, else one block per finding (ruff / rustc style).

No cell is ever squeezed below its content: file:line, a buffer's range, a grid point and
the headers are never folded, and a message is wrapped only between words. The width a
table needs is measured (rich's `Measurement` of each column's narrowest content); when it
does not fit, each finding is a block whose headline is `path:line: kind: message`, then
its kernel, source line, caller, the accesses involved, a `note: replay:` line and, where
the fix is known, a `help:` line.
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from pathlib import Path
from typing import TextIO

from rich import box
from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from pallas_check.findings.finding import Finding, JsonValue, SourceFrame, format_range
from pallas_check.findings.kinds import FindingKind
from pallas_check.config.display import Display
from pallas_check.report.run_report import (RunReport, kernel_counts, replay_command,
                                       suppressed_text, tiers_text)
from pallas_check.report.paths import display_path, display_text, project_root
from pallas_check.findings.units import findings_in_calls, plural

LOCATION = "cyan"
KIND = "bold red"
DIM = "dim"
INDENT = 4  # a block's lines under its headline
MIN_MESSAGE_WIDTH = 24  # narrower than this, a table's message column is a word a line


def fits(console: Console, table: Table) -> bool:
    """Whether `table` can be drawn at the console's width with no column below its
    narrowest content (measured as rich measures it, at any width)."""
    needed = Measurement.get(console, console.options.update_width(10_000), table).minimum
    return needed <= console.width


def unbroken_column(table: Table, console: Console, header: str,
                    cells: list[RenderableType], **kwargs: object) -> None:
    """A column whose cells are never wrapped nor folded: as wide as its widest cell."""
    wide = console.options.update_width(10_000)
    width = max(Measurement.get(console, wide, c).maximum for c in [Text(header), *cells])
    table.add_column(header, no_wrap=True, min_width=width, **kwargs)  # type: ignore[arg-type]


def print_wrapped(console: Console, text: Text, indent: int = 0, hang: int = INDENT) -> None:
    """`text` wrapped between words at the console's width, its first line `indent`
    columns in, the others `indent + hang`. A word wider than the line (a long path, a
    `file.py:LINE` location) stays whole and runs past the width, as compilers print it:
    split, it could not be clicked, copied or grepped."""
    width = max(20, console.width - indent - hang)
    lines = text.divide(_line_starts(text.plain, width))
    for i, line in enumerate(lines):
        line.rstrip()
        console.print(Text(" " * (indent + (hang if i else 0))) + line, soft_wrap=True)



def _line_starts(plain: str, width: int) -> list[int]:
    """Where greedy word wrapping at `width` starts each new line of `plain` (rich's own
    wrap either folds a long word or does not wrap at all)."""
    starts, column = [], 0
    for word in re.finditer(r"\S+\s*", plain):
        length = len(word.group().rstrip())
        if column and column + length > width:
            starts.append(word.start())
            column = 0
        column += len(word.group())
    return starts

@dataclasses.dataclass
class _Shown:
    """What the report's findings are shown with: the paths' root, the report's facts."""

    report: RunReport
    root: Path

    def path(self, file: str) -> str:
        return display_path(file, self.root)

    def text(self, message: str) -> str:
        return display_text(message, self.root)

    def where(self, frame: SourceFrame | None) -> Text:
        if frame is None:
            return Text("?")
        return Text.styled(f"{self.path(frame.file)}:{frame.line}", LOCATION)

    def message(self, f: Finding) -> str:
        """The finding's message, with in how many explored schedules it appeared."""
        message = self.text(" ".join(f.message.split()))
        schedules = f.schedules
        if schedules:
            message += f" (in {schedules[0]} of {schedules[1]} schedules tried)"
        return message


def _buffer(f: Finding) -> str:
    return f.buffer + format_range(f.index_range)


class TableReporter:
    def __init__(self, ascii_only: bool = False, width: int | None = None,
                 display: Display | None = None) -> None:
        display = display if display is not None else Display()
        self.display = dataclasses.replace(
            display, ascii_only=ascii_only or display.ascii_only,
            width=width if width is not None else display.width)

    def render(self, report: RunReport, stream: TextIO) -> None:
        console = self.display.console(stream)
        shown = _Shown(report, project_root(report.script))
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
            table = self._table(console, shown, kind, items, first)
            if fits(console, table):
                console.print(table)
                for index, f in enumerate(items, start=first):
                    console.print(Text.styled(f"  #{index} ", "bold") + shown.where(f.location),
                                  soft_wrap=True)
                    _print_details(console, shown, f)
            else:
                _print_blocks(console, shown, kind, items)
        _print_compiled(console, report)
        _print_traces(console, report)
        _print_unused_memory(console, report)
        for note in [*report.trace_notes, *report.notes]:  # (trace: --trace-limit)
            print_wrapped(console, Text.styled("note: ", "bold") + Text(note))
        if tiers := tiers_text(report):  # only when the compiled tier ran a call
            print_wrapped(console, Text(tiers))
        print_failures(console, report.user_error, report.user_traceback,
                       report.internal_error)
        style = "bold green" if not report.findings else "bold red"
        # The summary is one line whatever the width: CI logs and scripts grep for it.
        console.print(Text.styled("pallas-check: ", "bold")
                      + Text.styled(summary_line(report), style), soft_wrap=True)

    def _table(self, console: Console, shown: _Shown, kind: FindingKind,
               items: list[Finding], first: int) -> Table:
        table = Table(title=f"{kind.info.title} ({len(items)})", title_justify="left",
                      show_lines=True, expand=True,
                      box=box.ASCII if self.display.ascii_only else box.HEAVY_HEAD)
        rows = [_row(shown, index, f) for index, f in enumerate(items, start=first)]
        for col, header in enumerate(("#", "kernel", "buffer", "grid point", "where")):
            unbroken_column(table, console, header, [r[col] for r in rows])
        longest_word = max(len(word) for r in rows for word in r[5].plain.split() or [""])
        table.add_column("what", min_width=max(MIN_MESSAGE_WIDTH, longest_word),
                         overflow="fold", ratio=1)
        unbroken_column(table, console, "count", [r[6] for r in rows])
        for row in rows:
            table.add_row(*row)
        return table


def _row(shown: _Shown, index: int, f: Finding) -> list[Text]:
    buffer = _buffer(f) + (f"\n({f.memory_space})" if f.memory_space else "")
    grid = "" if f.grid_point is None else str(tuple(f.grid_point))
    count = f"×{f.count}" if f.count > 1 else ""
    return [Text(str(index)), Text(f"{f.kernel.name}\ncall {f.call_index}"), Text(buffer),
            Text(grid), shown.where(f.location), Text(shown.message(f)), Text(count)]


def headline(shown: _Shown, f: Finding) -> Text:
    """`path:line: kind: message (×N)`, as compilers and linters print a diagnostic."""
    frame = f.location
    where = (shown.where(frame) if frame is not None else
             Text.styled(f"{shown.path(f.kernel.file)}:{f.kernel.line}" if f.kernel.file
                  else shown.path(shown.report.script), LOCATION))
    count = f" (×{f.count})" if f.count > 1 else ""
    return (where + Text(": ") + Text.styled(f.kind.value, KIND) + Text(": ")
            + Text(shown.message(f) + count))


def _print_blocks(console: Console, shown: _Shown, kind: FindingKind,
                  items: list[Finding]) -> None:
    """One block per finding: the headline, then what the table's columns would say."""
    console.print(Text(f"{kind.info.title} ({len(items)})", style="bold underline"))
    for f in items:
        console.print()
        print_wrapped(console, headline(shown, f))
        facts = [f"kernel {f.kernel.name} (call {f.call_index})"]
        if f.buffer:
            facts.append(f"buffer {_buffer(f)}" + (f" ({f.memory_space})" if f.memory_space
                                                   else ""))
        if f.grid_point is not None:
            facts.append(f"grid point {tuple(f.grid_point)}")
        _print_facts(console, facts)
        _print_details(console, shown, f)
    console.print()


def _print_facts(console: Console, facts: list[str]) -> None:
    """`kernel k (call 0), buffer b[0:8] (VMEM), grid point (1,)`: a line break goes
    between two facts, never inside one."""
    line = ""
    for fact in facts:
        candidate = f"{line}, {fact}" if line else fact
        if line and INDENT + len(candidate) + 1 > console.width:
            console.print(Text.styled(" " * INDENT + line + ",", DIM), soft_wrap=True)
            candidate = fact
        line = candidate
    console.print(Text.styled(" " * INDENT + line, DIM), soft_wrap=True)


def _print_details(console: Console, shown: _Shown, f: Finding) -> None:
    """The source line, the call site, the accesses involved and how to replay it."""
    report = shown.report
    frame = f.location
    if frame is not None and frame.code:
        gutter = f"{frame.line} | "
        console.print(Text.styled(" " * INDENT + gutter, DIM) + Text.styled(frame.code, "bold"),
                      soft_wrap=True)
    site = next((c.call_site for c in report.calls if c.index == f.call_index
                 and getattr(c, "call_site", None) is not None), None)
    if site is not None:
        print_wrapped(console, Text.styled("called from ", DIM) + shown.where(site)
                      + Text(f": {site.code}" if site.code else ""), indent=INDENT)
    if f.accesses and f.kind.info.shows_accesses:
        _print_accesses(console, shown, f)
    replay = replay_command(report.script, report.config, f.seed, report.rerun,
                            report.script_args)
    print_wrapped(console, Text.styled("note: ", "bold") + Text("replay: " + replay),
                  indent=INDENT)
    if f.help:  # how to fix this one defect, where its checker knows (rustc's `help:`)
        print_wrapped(console, Text.styled("help: ", "bold cyan")
                      + Text(shown.text(" ".join(f.help.split()))), indent=INDENT)
    if report.trace and f.kind.info.on_timeline:
        print_wrapped(console, Text.styled("note: ", "bold")
                      + Text(f"timeline: open {report.trace} in ui.perfetto.dev"),
                      indent=INDENT)


def _print_accesses(console: Console, shown: _Shown, f: Finding) -> None:
    labels = f.kind.info.access_labels
    for i, a in enumerate(f.accesses):
        label = labels[i] if i < len(labels) else ""
        where = a.frames[0] if a.frames else None
        grid = f" at grid point {tuple(a.grid_point)}" if a.grid_point is not None else ""
        line = Text(shown.text(f"{label}{a.operation} {a.buffer}{format_range(a.index_range)}"
                               f" by {a.actor}{grid}: "))
        line += shown.where(where)
        if where is not None and where.code:
            line += Text(f": {where.code}")
        print_wrapped(console, line, indent=INDENT, hang=INDENT + 2)


def _print_compiled(console: Console, report: RunReport) -> None:
    """`--compile`: each call's VMEM per TPU generation (scoped use of the scoped limit,
    scratch included), or why it did not build, so the headroom shows before it is gone."""
    calls = [c for c in report.calls if getattr(c, "compiled", None)]
    if not calls:
        return
    console.print(Text.styled("VMEM per call and TPU generation (--compile):", "bold"))
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
                text += f" (scratch {_mib(entry['vmem_scratch_bytes'])} of it)"
            parts.append(text)
        print_wrapped(console, Text(f"call {call.index} {call.kernel}: " + "; ".join(parts)),
                      indent=2)


def _print_traces(console: Console, report: RunReport) -> None:
    """Several --tpu generations: how each further one's calls were traced -- by a run of
    the script of its own (intercept/generations.py), and how long it took -- or from the first's."""
    for generation, trace in getattr(report, "traces", {}).items():
        if "traced_as" in trace:
            text = (f"note: {generation} compiled from the {trace['traced_as']} trace (the"
                    " code ran once; a call whose shapes follow the chip is not"
                    f" {generation}'s own)")
        else:
            stopped = (f"; it stopped: {trace['script_error']}"
                       if trace.get("script_error") else "")
            seconds = f"{trace.get('seconds', 0.0):.2f} s"
            if trace.get("own_process"):
                how = "a run of the script of its own as that chip"
                seconds += (f", {trace.get('process_seconds', 0.0):.2f} s with its"
                            " process's start and compiles")
            else:
                how = "running the code again as that chip in this process"
            text = (f"note: {generation} traced by {how}:"
                    f" {plural(trace.get('calls', 0), 'call')},"
                    f" {plural(trace.get('findings', 0), 'finding')} kept; {seconds}{stopped}")
        print_wrapped(console, Text(text, style="yellow"))


def _print_unused_memory(console: Console, report: RunReport) -> None:
    """The note of memory a kernel never touches: one line per call that has some (a
    note, not a finding: a clean run stays clean), the cheapest VMEM to win back."""
    calls = [c for c in report.calls if getattr(c, "unused_memory", None)]
    if not calls:
        return
    console.print(Text.styled("Memory never touched (a note, not a finding):", "bold"))
    for call in calls:
        parts = "; ".join(u.text() for u in call.unused_memory)
        print_wrapped(console, Text(f"call {call.index} {call.kernel}: {parts}"), indent=2)


def _mib(nbytes: JsonValue) -> str:
    """A compile summary's byte count (None: the compiler did not say) in MiB."""
    if not isinstance(nbytes, (int, float)):
        return "?"
    return f"{nbytes / (1024 * 1024):.2f} MiB"


def summary_line(report: RunReport) -> str:
    """`N findings in M pallas_calls`, saying so when nothing was checked or the run
    did not finish."""
    calls = sum(1 for c in report.calls if not getattr(c, "failed", False))
    if report.internal_error:
        summary = (f"stopped by an error of pallas-check after {plural(calls, 'pallas_call')};"
                   f" {plural(len(report.findings), 'finding')} until then")
    elif calls == 0 and report.partial:
        summary = "no pallas_call was checked before the run stopped"
    elif calls == 0 and report.passed_through:
        summary = ("no pallas_call was checked: --kernel selected none of the kernels"
                   f" called ({', '.join(report.passed_through)})")
    elif calls == 0:
        summary = ("no pallas_call was checked: the script made none"
                   " (or its calls never ran)")
    else:
        summary = findings_in_calls(len(report.findings), calls)
    if report.passed_through and calls:
        summary += f"; {passed_through_text(report)}"
    if report.suppressed:
        summary += f"; {suppressed_text(report)}"
    if calls and report.config.get("races") is False:  # --no-races: a clean run says less
        summary += "; races not checked"
    if report.partial:
        stopped = "".join(
            f"; call {c.index} ({c.kernel}) stopped {c.stopped_text()}" for c in report.calls if getattr(c, "interrupted", False))
        summary += f" (partial: the run did not finish{stopped})"
    return summary


def passed_through_text(report: RunReport) -> str:
    """`498 passed through unchecked (matmul: 4 checked, 496 passed through; sgd: 2
    passed through)`: what --kernel and --calls did, per kernel."""
    total = sum(report.passed_through.values())
    parts = []
    for name, checked, passed in kernel_counts(report):
        counts = [f"{checked} checked"] if checked else []
        counts += [f"{passed} passed through"] if passed else []
        parts.append(f"{name}: {', '.join(counts)}")
    return f"{total} passed through unchecked ({'; '.join(parts)})"


def print_failures(console: Console, user_error: str | None, user_traceback: str | None,
                   internal_error: str | None) -> None:
    """The script's failure (with its traceback) and pallas-check's own, if any."""
    if user_error:
        print_wrapped(console, Text.styled("The script failed: ", "bold red") + Text(user_error))
        if user_traceback:
            console.print(Text(user_traceback.rstrip()), soft_wrap=True)
    if internal_error:
        print_wrapped(console, Text.styled("pallas-check error: ", "bold red")
                      + Text(internal_error))


def merge_reports(parts: list[tuple[str, str]]) -> str:
    """The hook's report: each script's table under a `== <script>` line, in order."""
    return "".join(f"== {shown}\n{text}" for shown, text in parts)
