"""Every output format, and per command the reporter that renders that command's report in
it: the registry of formats.

A member of `Format` carries, for each report a command makes (`run`'s findings, `diff`'s
comparison, `run --native`'s timings, `compile`'s builds), the reporter class that renders
it in that format, named "module:Class" under pallas_check/report/ and imported when used
(options.py and the command line read this table without loading rich or any report). A
command accepts exactly the formats that have a reporter for its report: `--help` offers
those as the choices of `--format` (`Format.choices`), with the help text built from the
same members (`Format.help`).

A member also carries what the rest of pallas-check needs to know of the format, so that
no module branches on a format's name: whether it is the table for people (`for_people`:
the user's traceback under it, the one-line wrong-chip verdict, the script's prints left on
stdout), whether a progress line may be drawn beside it (`progress_beside`), and how the
pre-commit hook merges several scripts' `run` reports into one file (`merge`, and
`part_check`, which refuses a part that is not this pallas-check's report), both named
"module:function" under pallas_check/report/ like the reporters.

A new format is a member here and a module under report/ with its reporter class(es) and
its merge; every reporter takes `display=` (where a table is shown: config/display.py) and
renders with `render(report, stream)`.

Nothing here imports a report module, rich or JAX (options.py imports it).
"""

from __future__ import annotations

import enum
import functools
import importlib
import io
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Protocol, TextIO, cast

if TYPE_CHECKING:
    from pallas_check.config.display import Display

# The reports commands make, by the command (or option) that makes them.
RUN = "run"  # pallas-check run: the findings (report/run_report.py's RunReport)
DIFF = "diff"  # pallas-check diff: ours against another side, output by output
NATIVE = "native"  # pallas-check run --native: each call timed on the hardware
COMPILE = "compile"  # pallas-check compile: each call built for real TPU generations
RECORD = "record"  # pallas-check record: the calls kept in a hardware recording


class Reporter(Protocol):
    """The contract every output format implements, for each report it renders."""

    # Any: each format's reporter of one command's report (RunReport, DiffReport, ...),
    # chosen at run time by `Format.reporter(kind)`
    def render(self, report: Any, stream: TextIO) -> None: ...


class _Spec(NamedTuple):
    """One format's entry (a `Format` member is made from it; see the module's docstring)."""

    name: str  # the `--format` name
    described: str  # how `--help` names it
    reporters: dict[str, str]  # report (RUN, DIFF, ...) -> "module:Class" in report/
    merge: str  # "module:function" in report/: scripts' `run` reports (the hook's) as one
    part_check: str | None = None  # "module:function": a part must be our report, or None
    for_people: bool = False  # the table for people (else a report for programs)
    progress_beside: bool = False  # a progress line may be drawn while it goes to stdout


class Format(str, enum.Enum):
    """Report formats (the value is the `--format` name), each with its reporters and what
    the commands need to know of it (_Spec)."""

    described: str
    reporters: dict[str, str]
    merge: str
    part_check: str | None
    # A table for people: under it the user's traceback when the script fails, and alone
    # the one-line verdict of a run on the wrong chip; the script's prints stay on stdout
    # (every other format is for programs: it owns stdout, the script prints to stderr).
    for_people: bool
    # Read by people as it comes (the table, the text's lines), so a terminal's stderr may
    # show a progress line beside it; JSON and SARIF are for programs, even on a terminal.
    progress_beside: bool

    def __new__(cls, *fields: object) -> Format:
        # a member's fields (its _Spec, whole); `Format("json")` looks a member up instead
        spec = _Spec._make(fields)
        member = str.__new__(cls, spec.name)
        member._value_ = spec.name
        member.described, member.reporters = spec.described, spec.reporters
        member.merge, member.part_check = spec.merge, spec.part_check
        member.for_people, member.progress_beside = spec.for_people, spec.progress_beside
        return member

    TABLE = _Spec("table", "a table for people",
                  {RUN: "table:TableReporter", DIFF: "comparison:DiffTableReporter",
                   NATIVE: "timings:NativeTableReporter",
                   COMPILE: "builds:CompileTableReporter",
                   RECORD: "recordings:RecordTableReporter"},
                  merge="table:merge_reports", for_people=True, progress_beside=True)
    JSON = _Spec("json", "json",
                 {RUN: "json:JsonReporter", DIFF: "comparison:DiffJsonReporter",
                  NATIVE: "timings:NativeJsonReporter", COMPILE: "builds:CompileJsonReporter",
                  RECORD: "recordings:RecordJsonReporter"},
                 merge="json:merge_reports", part_check="json:check_part")
    SARIF = _Spec("sarif", "sarif", {RUN: "sarif:SarifReporter"},
                  merge="sarif:merge_reports", part_check="sarif:check_part")
    TEXT = _Spec("text", "text (path:line: kind: message)", {RUN: "text:TextReporter"},
                 merge="text:merge_reports", progress_beside=True)

    def reporter(self, report: str = RUN, *, display: Display | None = None) -> Reporter:
        """This format's reporter of a command's report; `display` says where a table is
        shown (width, colours, boxes); the other formats ignore it."""
        where = self.reporters.get(report)
        if where is None:
            raise ValueError(f"the {report} report has no {self.value} format")
        make = cast("Callable[..., Reporter]", _load(where))  # a reporter class
        return make(display=display)

    def merged(self, parts: list[tuple[str, str]]) -> str:
        """Several scripts' `run` reports in this format as one (`pallas-check hook
        --output`); `parts` are (the script as shown, the text of its report), in order.
        Every part is checked before anything is merged: ValueError, one line, for one that
        is not a report this pallas-check writes in this format."""
        if self.part_check is not None:
            check = cast("Callable[[str, str], None]", _load(self.part_check))
            for shown, text in parts:
                check(shown, text)
        merge_parts = cast("Callable[[list[tuple[str, str]]], str]", _load(self.merge))
        return merge_parts(parts)

    @classmethod
    def accepted_by(cls, report: str) -> tuple[Format, ...]:
        """The formats a command's report can be rendered in, in `--help`'s order."""
        return tuple(fmt for fmt in cls if report in fmt.reporters)

    @classmethod
    def choices(cls, report: str) -> type[enum.Enum]:
        """The choices of a command's `--format`: this enum when it takes every format,
        else an enum of the formats it takes (typer offers an enum's values)."""
        return _choices(cls, report)

    @classmethod
    def default(cls, report: str) -> enum.Enum:
        """The choice `--format` defaults to: a table for people, for every command."""
        return cls.choices(report)(cls.TABLE.value)

    @classmethod
    def help(cls, report: str) -> str:
        """`--format`'s help: `Report format: a table for people, or json.`"""
        names = [fmt.described for fmt in cls.accepted_by(report)]
        listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + ", or " + names[-1]
        return f"Report format: {listed}."


@functools.cache
def _choices(formats: type[Format], report: str) -> type[enum.Enum]:
    accepted = formats.accepted_by(report)
    if len(accepted) == len(formats):
        return formats
    name = "".join(fmt.value.title() for fmt in accepted) + "Format"  # e.g. TableJsonFormat
    return enum.Enum(name, {fmt.name: fmt.value for fmt in accepted},  # type: ignore[return-value]
                     type=str, module=__name__)


def _load(where: str) -> object:
    """The class or function named "module:name" under pallas_check/report/, imported now
    (its caller knows what the spec's field names: a reporter class, a merge function)."""
    module, name = where.split(":")
    loaded: object = getattr(importlib.import_module(f"pallas_check.report.{module}"), name)
    return loaded


def render(report: object, fmt: str, kind: str = RUN, display: Display | None = None) -> str:
    """A command's report rendered in format `fmt` (a name or a member) as text."""
    buffer = io.StringIO()
    Format(fmt).reporter(kind, display=display).render(report, buffer)
    return buffer.getvalue()
