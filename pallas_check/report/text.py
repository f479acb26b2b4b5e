"""One line per finding, `path:line[:column]: kind: message`, for editors, grep and quickfix
lists, each followed by a `path:line: note: replay: COMMAND` line (as compilers add notes)
and, where the fix is known, a `path:line: help: HOW` line, and a last `pallas-check: N
findings in M pallas_calls` line (the only line of a clean run on the engine alone; when
the compiled tier ran calls, a `SCRIPT: note: N of M calls ran compiled ...` line before it)."""

from __future__ import annotations

from typing import TextIO

from pallas_check.findings.finding import Finding, format_range
from pallas_check.report.run_report import (RunReport, replay_command, suppressed_text,
                                            tiers_text)
from pallas_check.report.paths import display_path, display_text, project_root
from pallas_check.report.table import summary_line


class TextReporter:
    def __init__(self, display: object = None) -> None:
        pass  # one line per finding, whatever the width

    def render(self, report: RunReport, stream: TextIO) -> None:
        root = project_root(report.script)
        script = display_path(report.script, root)
        for f in report.findings:
            where = _where(f, root, script)
            buffer = f" [{f.buffer}{format_range(f.index_range)}]" if f.buffer else ""
            count = f" (x{f.count})" if f.count > 1 else ""
            message = display_text(" ".join(f.message.split()), root)
            stream.write(f"{where}: {f.kind.value}: {f.kernel.name}{buffer}: {message}"
                         f"{count}\n")
            replay = replay_command(report.script, report.config, f.seed, report.rerun,
                                    report.script_args)
            stream.write(f"{where}: note: replay: {replay}\n")
            if f.help:  # how to fix it, as compilers add a help line after their notes
                stream.write(f"{where}: help: {display_text(' '.join(f.help.split()), root)}\n")
        if report.suppressed:  # "k.py: suppressed: 3 findings (inline 2, baseline 1)"
            count, _, parts = suppressed_text(report).partition(" suppressed ")
            noun = "finding" if count == "1" else "findings"
            stream.write(f"{script}: suppressed: {count} {noun} {parts}\n")
        if tiers := tiers_text(report):  # "k.py: note: 3 of 5 calls ran compiled ..."
            stream.write(f"{script}: note: {tiers}\n")
        for note in report.notes:  # what the run could not check
            stream.write(f"{script}: note: {note}\n")
        if report.user_error:
            stream.write(f"{script}: script-failed: {report.user_error}\n")
        if report.internal_error:
            stream.write(f"{script}: pallas-check-error: {report.internal_error}\n")
        stream.write(f"pallas-check: {summary_line(report)}\n")


def _where(f: Finding, root: object, script: str) -> str:
    """`path:line[:column]` of the finding (its kernel's definition, else the script)."""
    frame = f.location
    if frame is not None:
        return (f"{display_path(frame.file, root)}:{frame.line}"  # type: ignore[arg-type]
                + (f":{frame.column}" if frame.column else ""))
    if f.kernel.file:
        return f"{display_path(f.kernel.file, root)}:{f.kernel.line}"  # type: ignore[arg-type]
    return script


def merge_reports(parts: list[tuple[str, str]]) -> str:
    """The hook's report: every script's lines, in order (each line names its file)."""
    return "".join(text for _, text in parts)
