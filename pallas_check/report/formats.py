"""Every output format, and per command the reporter that renders that command's report in
it: the registry of formats.

A member of `Format` carries, for each report a command makes (`run`'s findings, `diff`'s
comparison, `run --native`'s timings, `compile`'s builds), the reporter class that renders
it in that format, named "module:Class" under pallas_check/report/ and imported when used
(options.py and the command line read this table without loading rich or any report). A
command accepts exactly the formats that have a reporter for its report: `--help` offers
those as the choices of `--format` (`Format.choices`), with the help text built from the
same members (`Format.help`).

A new format is a member here and a module under report/ with its reporter class(es);
every reporter takes `display=` (where a table is shown: report/console.py) and renders
with `render(report, stream)`.

Nothing here imports a report module, rich or JAX (options.py imports it).
"""

from __future__ import annotations

import enum
import functools
import importlib
import io
from typing import TYPE_CHECKING, Any, Protocol, TextIO

if TYPE_CHECKING:
    from pallas_check.report.console import Display

# The reports commands make, by the command (or option) that makes them.
RUN = "run"  # pallas-check run: the findings (report/model.py's RunReport)
DIFF = "diff"  # pallas-check diff: ours against another side, output by output
NATIVE = "native"  # pallas-check run --native: each call timed on the hardware
COMPILE = "compile"  # pallas-check compile: each call built for real TPU generations


class Reporter(Protocol):
    """The contract every output format implements, for each report it renders."""

    def render(self, report: Any, stream: TextIO) -> None: ...


class Format(str, enum.Enum):
    """Report formats (the value is the `--format` name), each with its reporters."""

    described: str  # how `--help` names it
    reporters: dict[str, str]  # report (RUN, DIFF, ...) -> "module:Class" in report/

    def __new__(cls, name: str, described: str, reporters: dict[str, str]) -> Format:
        member = str.__new__(cls, name)
        member._value_ = name
        member.described = described
        member.reporters = reporters
        return member

    TABLE = ("table", "a table for people",
             {RUN: "table:TableReporter", DIFF: "diff:DiffTableReporter",
              NATIVE: "native:NativeTableReporter", COMPILE: "compile:CompileTableReporter"})
    JSON = ("json", "json",
            {RUN: "json:JsonReporter", DIFF: "diff:DiffJsonReporter",
             NATIVE: "native:NativeJsonReporter", COMPILE: "compile:CompileJsonReporter"})
    SARIF = ("sarif", "sarif", {RUN: "sarif:SarifReporter"})
    TEXT = ("text", "text (path:line: kind: message)", {RUN: "text:TextReporter"})

    def reporter(self, report: str = RUN, *, display: Display | None = None) -> Reporter:
        """This format's reporter of a command's report; `display` says where a table is
        shown (width, colours, boxes); the other formats ignore it."""
        where = self.reporters.get(report)
        if where is None:
            raise ValueError(f"the {report} report has no {self.value} format")
        module, name = where.split(":")
        reporter_class = getattr(importlib.import_module(f"pallas_check.report.{module}"),
                                 name)
        return reporter_class(display=display)  # type: ignore[no-any-return]

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


def render(report: Any, fmt: str, kind: str = RUN, display: Display | None = None) -> str:
    """A command's report rendered in format `fmt` (a name or a member) as text."""
    buffer = io.StringIO()
    Format(fmt).reporter(kind, display=display).render(report, buffer)
    return buffer.getvalue()
