"""Hands a finished report to the user: the file or stdout, and the lines for stderr.

`run`, `diff` and `run --native` all end here, so the rules of where output goes are
written once: the report on stdout or in `--output` (see outfile.py); the script's
traceback on stderr when the report does not show it; our own error as one line.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from pallas_check.outfile import OutputError, is_stdout, write_report


def write_stdout(text: str, stream: TextIO | None = None) -> None:
    """Write to stdout (or `stream`, the stdout the run started with) even when its
    encoding cannot spell every character (those are replaced)."""
    stream = stream if stream is not None else sys.stdout
    try:
        stream.write(text)
    except UnicodeEncodeError:
        encoding = getattr(stream, "encoding", None) or "ascii"
        stream.write(text.encode(encoding, "replace").decode(encoding))
    stream.flush()


def deliver(text: str, output: Path | None, *, summary: str, shows_traceback: bool,
            traceback_text: str | None, error: str | None,
            stdout: TextIO | None = None) -> bool:
    """Write the report; return False when `--output` could not be written (the report
    then went to stdout instead, so that it is not lost).

    summary: the line stderr gets when the report went to a file; traceback_text: the
    script's traceback, printed on stderr unless the report (shows_traceback) holds it."""
    to_file = output is not None and not is_stdout(output)
    if traceback_text and not (shows_traceback and not to_file):
        sys.stderr.write(traceback_text if traceback_text.endswith("\n")
                         else traceback_text + "\n")
    written = True
    if to_file:
        assert output is not None
        try:
            write_report(output, text)
            print(f"pallas-check: {summary}; report written to {output}", file=sys.stderr)
        except (OSError, OutputError) as exc:
            detail = getattr(exc, "strerror", None) or str(exc)
            print(f"pallas-check: error: cannot write the report to {output}: {detail};"
                  " it follows on stdout", file=sys.stderr)
            write_stdout(text, stdout)
            written = False
    else:
        write_stdout(text, stdout)
    if error:
        print(f"pallas-check: error: {error}", file=sys.stderr)
    return written
