"""Hands a finished report to the user: the file or stdout, and the lines for stderr.

`run`, `diff` and `run --native` all end here, so the rules of where output goes are
written once: the report on stdout or in `--output` (see deliver/outfile.py); the script's
traceback on stderr when the report does not show it; our own error as one line.

A reader that stopped reading is no failure of the run (`pallas-check run k.py | head -1`,
a pager closed early), and neither is a stdout closed before the start (`>&-`): as other
tools do, the rest of the text is dropped quietly and the run ends with its own exit code
-- never `internal error: BrokenPipeError` and exit 4.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any, Iterable, Iterator, TextIO

from pallas_check.deliver.outfile import OutputError, is_stdout, stream_descriptor, write_report
from pallas_check.config.formats import Format


def write_stdout(text: str, stream: TextIO | None = None) -> None:
    """Write to stdout (or `stream`, the stdout the run started with) even when its
    encoding cannot spell every character (those are replaced); nothing when stdout is
    closed, and quietly nothing more once its reader has gone (`discard`)."""
    stream = stream if stream is not None else sys.stdout
    if stream is None:  # closed before we started (`>&-`): Python made it None
        return
    try:
        try:
            stream.write(text)
        except UnicodeEncodeError:
            encoding = getattr(stream, "encoding", None) or "ascii"
            stream.write(text.encode(encoding, "replace").decode(encoding))
        stream.flush()
    except BrokenPipeError:
        discard(stream)


def discard(stream: TextIO) -> None:
    """From now on what goes to `stream` goes nowhere: its descriptor onto /dev/null.
    Its reader has gone (EPIPE); without this every later write, and the interpreter's
    own flush at exit ("Exception ignored ... BrokenPipeError", exit 120), fails again."""
    try:
        fd = stream.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
    except (OSError, ValueError):  # no descriptor of its own (a test's stream): drop it
        return
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


class QuietStream:
    """The script's stdout or stderr while it runs: everything passes to `stream`, but a
    reader that has gone (EPIPE) ends the writing quietly (`discard`) instead of failing
    the script (`| head -1` takes the script's first line; the second print would have
    ended the run as the script's crash, exit 3). The rest is `stream`'s own."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            discard(self._stream)
            return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            discard(self._stream)

    def __getattr__(self, name: str) -> Any:  # Any: the wrapped stream's, by any name
        return getattr(self._stream, name)


# The QuietStream of each stream, made once and kept for the life of the process. `print`
# holds the stream it took from `sys.stdout` without a reference of its own (CPython 3.11),
# and the write can let other threads run: a host callback of a computation the user
# stopped still prints on an XLA thread while the main thread restores `sys.stdout`; were
# the QuietStream freed then, the print would go on in freed memory (a SIGSEGV instead of
# the partial report).
_made: dict[int, "QuietStream"] = {}


def quiet(stream: TextIO | None) -> QuietStream | None:
    """`stream` as a QuietStream (None, a closed stream, stays None)."""
    if stream is None:
        return None
    made = _made.get(id(stream))
    if made is None:  # (a QuietStream holds its stream: the id is never another's)
        made = _made[id(stream)] = QuietStream(stream)
    return made


def report_owns_stdout(fmt: str, output: Path | None) -> bool:
    """Whether a machine-readable report goes to stdout (then nothing else may)."""
    return not Format(fmt).for_people and (output is None or str(output) == "-")


@contextlib.contextmanager
def script_streams(fmt: str, output: Path | None) -> Iterator[None]:
    """The script's stdout and stderr while it runs. When a machine-readable report owns
    stdout, the script's prints go to stderr, so that stdout parses. A stream whose reader
    has gone (`| head -1`) takes the script's writes quietly (delivery.QuietStream): a
    closed pipe is no crash of the script's."""
    prints = sys.stderr if report_owns_stdout(fmt, output) else sys.stdout
    with contextlib.redirect_stdout(quiet(prints)), contextlib.redirect_stderr(
            quiet(sys.stderr)):
        yield


def note(text: str) -> None:
    """One of our lines for stderr (a newline added unless it ends in one); nothing when
    stderr is closed or its reader has gone (`2>&1 | head -1`): that is no failure of
    the run, whose exit code stays its own."""
    stream = sys.stderr
    if stream is None:
        return
    try:
        stream.write(text if text.endswith("\n") else text + "\n")
        stream.flush()
    except BrokenPipeError:
        discard(stream)


def flush_streams() -> None:
    """stdout and stderr flushed before the process ends without the interpreter's own
    exit (os._exit): a closed or gone one is skipped quietly."""
    for stream in (sys.stdout, sys.stderr):
        if stream is None:
            continue
        try:
            stream.flush()
        except BrokenPipeError:
            discard(stream)
        except (OSError, ValueError):
            pass


def deliver(text: str, output: Path | None, *, summary: str, shows_traceback: bool,
            traceback_text: str | None, error: str | None,
            stdout: TextIO | None = None) -> bool:
    """Write the report; return False when `--output` could not be written (the report
    then went to stdout instead, so that it is not lost).

    summary: the line stderr gets when the report went to a file; traceback_text: the
    script's traceback, printed on stderr unless the report (shows_traceback) holds it."""
    to_file = output is not None and not is_stdout(output)
    if traceback_text and not (shows_traceback and not to_file):
        note(traceback_text)
    written = True
    if to_file:
        assert output is not None
        try:
            write_report(output, text)
            note(f"pallas-check: {summary}; report written to {output}")
        except BrokenPipeError:
            if stream_descriptor(output) is None:
                raise  # (a file is never a pipe whose reader left: not expected)
            # `-o /dev/stdout | head -1`: the reader of that descriptor stopped reading.
        except (OSError, OutputError) as exc:
            detail = getattr(exc, "strerror", None) or str(exc)
            note(f"pallas-check: error: cannot write the report to {output}: {detail};"
                 " it follows on stdout")
            write_stdout(text, stdout)
            written = False
    else:
        write_stdout(text, stdout)
    if error:
        note(f"pallas-check: error: {error}")
    return written
