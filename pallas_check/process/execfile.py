"""Run the user's script as `__main__`, unmodified; a crash in it is the user's (exit 3).

The script's own traceback is kept (with pallas-check's frames trimmed) so the report can
show it as the user's; `sys.exit(0)` is a clean end, any other exit code is the user's
failure. Ctrl-C ends the run early and the report is marked partial.
"""

from __future__ import annotations

import dataclasses
import os
import runpy
import sys
import traceback
from typing import Sequence


@dataclasses.dataclass
class ScriptOutcome:
    """How the user's script ended."""

    ok: bool
    exit_code: int | None = None  # the script's own sys.exit code, if it called it
    error: str | None = None  # one line: exception type and message
    traceback: str | None = None  # the user's traceback, our frames trimmed
    interrupted: bool = False
    exception: BaseException | None = None


_OUR_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _is_runpy(filename: str) -> bool:
    """runpy's frames: `.../runpy.py`, or `<frozen runpy>` on Python 3.11+."""
    return filename == "<frozen runpy>" or os.path.basename(filename) == "runpy.py"


def _user_traceback(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith(_OUR_DIR) and not _is_runpy(f.filename)]
    lines = ["Traceback (most recent call last):\n"]
    lines += traceback.format_list(frames)
    lines += traceback.format_exception_only(type(exc), exc)
    return "".join(lines)


def run_script(path: str, args: Sequence[str]) -> ScriptOutcome:
    """Execute `path` as `__main__` with `args` as its sys.argv[1:]."""
    script = os.path.abspath(path)
    saved_argv, saved_path0 = sys.argv[:], sys.path[0] if sys.path else None
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(script))
    try:
        runpy.run_path(script, run_name="__main__")
        return ScriptOutcome(ok=True)
    except SystemExit as exc:
        code = exc.code
        if code is None or code == 0:
            return ScriptOutcome(ok=True, exit_code=0)
        numeric = code if isinstance(code, int) else 1
        message = None if isinstance(code, int) else str(code)
        return ScriptOutcome(ok=False, exit_code=numeric,
                             error=message or f"the script exited with code {numeric}")
    except KeyboardInterrupt as exc:
        return ScriptOutcome(ok=False, interrupted=True, error="interrupted (Ctrl-C)",
                             exception=exc)
    except BaseException as exc:  # the user's crash, reported as theirs
        first_line = (str(exc).strip().splitlines() or [""])[0]
        return ScriptOutcome(ok=False, error=f"{type(exc).__name__}: {first_line}".rstrip(": "),
                             traceback=_user_traceback(exc), exception=exc)
    finally:
        sys.argv = saved_argv
        if sys.path and sys.path[0] == os.path.dirname(script):
            sys.path.pop(0)
        elif saved_path0 is not None and os.path.dirname(script) in sys.path:
            sys.path.remove(os.path.dirname(script))
