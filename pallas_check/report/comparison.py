"""The report of `pallas-check diff`: a rich table per run, or JSON (versioned schema)."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Protocol, Sequence, TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from pallas_check.findings.finding import JsonObject, JsonValue
from pallas_check.findings.output_diff import OutputDiff
from pallas_check.config.display import Display
from pallas_check.report.json import dump, header
from pallas_check.report.paths import display_path, project_root
from pallas_check.report.table import (INDENT, MIN_MESSAGE_WIDTH, fits, print_failures,
                                       print_wrapped, unbroken_column)
from pallas_check.findings.units import plural

SCHEMA = "pallas-check/diff"
SCHEMA_VERSION = 1
TABLE_FIRST = 3  # mismatching elements shown per output in the table (JSON: all kept)
MATCHING_ROWS = 40  # beyond this many rows, matching outputs are only counted


class PlacedCall(Protocol):
    """A call as a report names it: its index on its device, its kernel and where the
    kernel is, its grid (a diff's calls, a recording's)."""

    @property
    def index(self) -> int: ...
    @property
    def device(self) -> int: ...
    @property
    def kernel(self) -> str: ...
    @property
    def file(self) -> str: ...
    @property
    def line(self) -> int: ...
    @property
    def grid(self) -> tuple[int, ...]: ...


class DiffedCall(PlacedCall, Protocol):
    """One call of a diff report, as rendered (commands/diff.py's CallDiff)."""

    @property
    def outputs(self) -> Sequence[OutputDiff]: ...
    @property
    def error(self) -> str | None: ...  # the other side could not run this call
    @property
    def mismatches(self) -> int: ...
    @property
    def disagreement(self) -> str | None: ...  # replay: why the call disagrees otherwise
    @property
    def note(self) -> str | None: ...
    @property
    def findings(self) -> int: ...
    @property
    def finding_kinds(self) -> Sequence[str]: ...


class DiffedRun(Protocol):
    """What `pallas-check diff` reports, as rendered (commands/diff.py's DiffReport; reports
    import no command)."""

    @property
    def script(self) -> str: ...
    @property
    def against(self) -> str: ...
    @property
    def config(self) -> Mapping[str, JsonValue]: ...
    @property
    def against_config(self) -> Mapping[str, JsonValue] | None: ...
    @property
    def rtol(self) -> float | None: ...
    @property
    def atol(self) -> float | None: ...
    @property
    def calls(self) -> Sequence[DiffedCall]: ...
    @property
    def findings(self) -> int: ...
    @property
    def exit_code(self) -> int: ...
    @property
    def user_error(self) -> str | None: ...
    @property
    def user_traceback(self) -> str | None: ...
    @property
    def internal_error(self) -> str | None: ...
    @property
    def partial(self) -> bool: ...
    @property
    def mismatching_outputs(self) -> int: ...
    @property
    def disagreements(self) -> Sequence[str]: ...  # replay: beyond the calls' outputs
    @property
    def recording(self) -> Mapping[str, JsonValue] | None: ...  # replay: where it was made


# A row of the table: a call and one of its outputs, or None for a call not compared.
_Row = tuple[DiffedCall, OutputDiff | None]


def _number(x: float | None) -> float | str | None:
    if x is None:
        return None
    return x if x == x and abs(x) != float("inf") else str(x)


def diff_dict(report: DiffedRun) -> JsonObject:
    """The report as JSON-ready data; stable key order, no timestamps (reproducible)."""
    calls: list[JsonObject] = []
    for c in report.calls:
        outputs: list[JsonObject] = []
        for o in c.outputs:
            outputs.append({
                "output": o.output, "name": o.name, "shape": list(o.shape), "dtype": o.dtype,
                "size": o.size, "mismatches": o.mismatches,
                "max_abs": None if o.drawn else _number(o.max_abs),
                "max_rel": None if o.drawn else _number(o.max_rel),
                "rtol": None if o.drawn else o.rtol, "atol": None if o.drawn else o.atol,
                "note": o.note, "never_written": o.never_written, "drawn": o.drawn,
                "explained": o.explained,
                "first_mismatches": [{"index": list(m.index), "ours": m.ours,
                                      "theirs": m.theirs} for m in o.first],
            })
        calls.append({"index": c.index, "device": c.device, "kernel": c.kernel,
                      "file": c.file, "line": c.line, "grid": list(c.grid),
                      "mismatches": c.mismatches, "error": c.error,
                      "disagreement": c.disagreement, "note": c.note,
                      "findings": c.findings, "finding_kinds": list(c.finding_kinds),
                      "outputs": outputs})
    return {
        **header(SCHEMA, SCHEMA_VERSION, report.script),
        "ours": report.config,
        "against": report.against,
        "against_config": report.against_config,
        "recording": report.recording,
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
            "never_written_elements": never_written(report),
            "drawn_outputs": sum(o.drawn for c in report.calls for o in c.outputs),
            "explained_elements": sum(o.explained for c in report.calls for o in c.outputs),
            "disagreements": len(report.disagreements)
            + sum(1 for c in report.calls if c.disagreement),
        },
        "disagreements": list(report.disagreements),
        "calls": calls,
    }


def _fmt(x: float) -> str:
    if x != x or abs(x) == float("inf"):
        return str(x)
    return f"{x:.3g}"


def _rows(report: DiffedRun) -> tuple[list[_Row], int]:
    """(call, output or None for a call not compared) in order, and how many matching
    outputs are left out (beyond MATCHING_ROWS rows only mismatches are listed)."""
    rows: list[_Row] = [(c, o) for c in report.calls for o in c.outputs]
    rows += [(c, None) for c in report.calls if c.error or c.disagreement or c.note]
    rows.sort(key=lambda r: (r[0].index, r[0].device, -1 if r[1] is None else r[1].output))
    if len(rows) <= MATCHING_ROWS:
        return rows, 0
    kept = [(c, o) for c, o in rows
            if o is None or o.mismatches or o.never_written or o.drawn or o.explained]
    return kept, len(rows) - len(kept)


def _first(o: OutputDiff) -> str:
    """The first mismatching elements (index: ours vs theirs), one a line, and the note."""
    first = "\n".join(f"{list(m.index)}: {m.ours} vs {m.theirs}"
                      for m in o.first[:TABLE_FIRST])
    if o.mismatches > TABLE_FIRST:
        first += "\n…"
    if o.note:
        first = (first + "\n" if first else "") + o.note
    for said in _apart(o):
        first = (first + "\n" if first else "") + said
    return first


_DRAWN = "drawn from the chip's PRNG: not compared"


def _apart(o: OutputDiff) -> list[str]:
    """What of an output was counted apart from its mismatches, one line each."""
    said = []
    if o.never_written:
        said.append(f"never written: {plural(o.never_written, 'element')} (not compared)")
    if o.drawn:
        said.append(_DRAWN)
    if o.explained:
        said.append(f"explained by ours' finding: {plural(o.explained, 'element')} differ"
                    f" (not counted)")
    return said


def _call_text(c: DiffedCall) -> tuple[str, Text]:
    """A call's row without an output: what it says, and its state (not compared, or
    disagrees, or a note)."""
    words = [w for w in (c.disagreement, c.error, c.note) if w]
    if c.disagreement:
        return "; ".join(words), Text("disagrees", style="bold red")
    if c.error:
        return "; ".join(words), Text("not compared", style="bold red")
    return "; ".join(words), Text("agrees", style="green")


def _count(o: OutputDiff) -> Text:
    if o.drawn and not o.mismatches:
        return Text("not compared", style="yellow")
    return Text(f"{o.mismatches} of {o.size}" if o.mismatches else "0",
                style="bold red" if o.mismatches else "green")


def _table(console: Console, report: DiffedRun, rows: list[_Row], root: Path,
           title: str) -> Table:
    """The diff as a table whose cells keep their content whole (see report/table.py)."""
    cells: list[list[Text]] = []
    for c, o in rows:
        call = Text(f"{c.index}" + (f" (device {c.device})" if c.device else ""))
        kernel = Text(f"{c.kernel}\n{display_path(c.file, root)}:{c.line}")
        if o is None:
            said, state = _call_text(c)
            cells.append([call, kernel, Text(""), Text(""), Text(""), state, Text(""),
                          Text(""), Text(said)])
            continue
        cells.append([call, kernel, Text(o.name), Text(str(tuple(o.shape))), Text(o.dtype),
                      _count(o), Text("" if o.drawn else _fmt(o.max_abs)),
                      Text("" if o.drawn else _fmt(o.max_rel)),
                      Text(_first(o))])
    table = Table(title=title, title_justify="left", show_lines=True, expand=True)
    headers = ("call", "kernel", "output", "shape", "dtype", "mismatches", "max abs",
               "max rel")
    for col, header in enumerate(headers):
        unbroken_column(table, console, header, [r[col] for r in cells])
    longest_word = max((len(w) for r in cells for w in r[8].plain.split()), default=0)
    table.add_column("first mismatches (index: ours vs theirs)",
                     min_width=max(MIN_MESSAGE_WIDTH, longest_word), overflow="fold",
                     ratio=1)  # the room a wide terminal has left goes to this column
    for row in cells:
        table.add_row(*row)
    return table


def _print_blocks(console: Console, rows: list[_Row], root: Path,
                  title: str) -> None:
    """One block per output, `path:line: call N kernel: output ...`, for a narrow terminal."""
    console.print(Text(title, style="bold underline"))
    for c, o in rows:
        device = f" (device {c.device})" if c.device else ""
        head = (Text(f"{display_path(c.file, root)}:{c.line}", style="cyan")
                + Text(f": call {c.index}{device} {c.kernel}: "))
        if o is None:
            said, state = _call_text(c)
            print_wrapped(console, head + state + Text(f": {said}"))
            continue
        head += Text(f"output {o.name} (shape {tuple(o.shape)}, {o.dtype}): ")
        if not o.mismatches:
            apart = "; ".join(s for s in _apart(o) if s != _DRAWN)
            state = (Text(_DRAWN, style="yellow") if o.drawn
                     else Text("all match", style="green"))
            print_wrapped(console, head + state + Text(f" ({apart})" if apart else ""))
            continue
        print_wrapped(console, head + _count(o) + Text(f" differ, max abs {_fmt(o.max_abs)},"
                                                       f" max rel {_fmt(o.max_rel)}"))
        for line in _first(o).splitlines():
            print_wrapped(console, Text(line), indent=INDENT)


def render_table(report: DiffedRun, stream: TextIO, display: Display | None = None) -> None:
    console = (display if display is not None else Display()).console(stream)
    root = project_root(report.script)
    rows, hidden = _rows(report)
    tol = ("per dtype" if report.rtol is None and report.atol is None
           else f"rtol={report.rtol}, atol={report.atol}")
    command = "diff" if report.recording is None else "replay"
    title = f"pallas-check {command}: ours vs {report.against} ({tol})"
    if rows:
        table = _table(console, report, rows, root, title)
        if fits(console, table):
            console.print(table)
        else:
            _print_blocks(console, rows, root, title)
    if hidden:
        console.print(Text(f"{plural(hidden, 'matching output')} not shown.", style="dim"))
    if report.findings:
        print_wrapped(console, Text(f"Our run also reported {plural(report.findings, 'finding')};"
                                    f" `pallas-check run` shows them.", style="yellow"))
    for line in report.disagreements:
        print_wrapped(console, Text("Disagrees: ", style="bold red") + Text(line))
    print_failures(console, report.user_error, report.user_traceback,
                   report.internal_error)
    bad = report.mismatching_outputs
    bad += len(report.disagreements) + sum(1 for c in report.calls if c.disagreement)
    summary = f"{summary_text(report)} (ours vs {report.against})"
    if report.partial:
        summary += " (partial: the run did not finish)"
    print_wrapped(console, Text("pallas-check: ", style="bold")
                  + Text(summary, style="bold red" if bad else "bold green"))


class DiffTableReporter:
    def __init__(self, display: Display | None = None) -> None:
        self.display = display

    def render(self, report: DiffedRun, stream: TextIO) -> None:
        render_table(report, stream, self.display)


class DiffJsonReporter:
    def __init__(self, display: Display | None = None) -> None:
        pass  # a file's bytes do not depend on where they are shown

    def render(self, report: DiffedRun, stream: TextIO) -> None:
        dump(diff_dict(report), stream)


__all__ = ["DiffJsonReporter", "DiffTableReporter", "diff_dict"]


def never_written(report: DiffedRun) -> int:
    """The output elements ours never wrote, over the run (not compared)."""
    return sum(o.never_written for c in report.calls for o in c.outputs)


def summary_text(report: DiffedRun) -> str:
    """`1 of 3 outputs differs in 2 pallas_calls`: the report's summary line, and the
    stderr line when the report went to a file (`; never written: N elements` when ours
    left some, `; 2 disagreements` for a replay's other disagreements)."""
    outputs = sum(len(c.outputs) for c in report.calls)
    bad = report.mismatching_outputs
    text = (f"{bad} of {plural(outputs, 'output')} {'differs' if bad == 1 else 'differ'}"
            f" in {plural(len(report.calls), 'pallas_call')}")
    unwritten = never_written(report)
    if unwritten:
        text += f"; never written: {plural(unwritten, 'element')} (not compared)"
    drawn = sum(o.drawn for c in report.calls for o in c.outputs)
    if drawn:
        text += f"; drawn from the chip's PRNG: {plural(drawn, 'output')} (not compared)"
    explained = sum(o.explained for c in report.calls for o in c.outputs)
    if explained:
        text += (f"; explained by ours' findings: {plural(explained, 'element')}"
                 f" (not counted)")
    others = len(report.disagreements) + sum(1 for c in report.calls if c.disagreement)
    if others:
        text += f"; {plural(others, 'other disagreement')}"
    return text
