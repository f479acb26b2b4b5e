"""One line per finding, `path:line: kind: message`, for editors, grep and quickfix lists."""

from __future__ import annotations

from typing import TextIO

from pallas_check.findings import format_range
from pallas_check.report.model import RunReport, suppressed_text
from pallas_check.report.paths import display_path, display_text


class TextReporter:
    def render(self, report: RunReport, stream: TextIO) -> None:
        for f in report.findings:
            frame = f.location
            where = f"{display_path(frame.file)}:{frame.line}" if frame else (
                f"{display_path(f.kernel.file)}:{f.kernel.line}" if f.kernel.file
                else display_path(report.script))
            buffer = f" [{f.buffer}{format_range(f.index_range)}]" if f.buffer else ""
            count = f" (x{f.count})" if f.count > 1 else ""
            message = display_text(" ".join(f.message.split()))
            stream.write(f"{where}: {f.kind.value}: {f.kernel.name}{buffer}: {message}"
                         f"{count}\n")
        if report.suppressed:  # "k.py: suppressed: 3 findings (inline 2, baseline 1)"
            count, _, parts = suppressed_text(report).partition(" suppressed ")
            noun = "finding" if count == "1" else "findings"
            stream.write(f"{display_path(report.script)}: suppressed: {count} {noun}"
                         f" {parts}\n")
        if report.user_error:
            stream.write(f"{display_path(report.script)}: script-failed: {report.user_error}\n")
        if report.internal_error:
            stream.write(f"{display_path(report.script)}: pallas-check-error:"
                         f" {report.internal_error}\n")
