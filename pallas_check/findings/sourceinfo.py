"""The user's source frames for a jaxpr equation, with JAX's and our own frames trimmed."""

from __future__ import annotations

import functools
import itertools
import linecache
import os
from typing import Any, Protocol, Sequence

import jax

from pallas_check.findings.finding import SourceFrame

_JAX_DIR = os.path.dirname(jax.__file__)
_JAX_LIB_DIRS = tuple(
    os.path.dirname(os.path.dirname(jax.__file__)) + os.sep + name + os.sep
    for name in ("jax", "jaxlib", "numpy", "ml_dtypes")
)
_OUR_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_EXCLUDED_PREFIXES = _JAX_LIB_DIRS + (_OUR_DIR,)
_EXCLUDED_PARTS = (os.sep + "contextlib.py", "<frozen ", os.sep + "runpy.py")
# The kernels JAX ships are kernel code like the user's own: a finding in one of them points
# at its lines (JAX's other frames are trimmed).
_SHIPPED_KERNELS = os.path.join(_JAX_DIR, "experimental", "pallas", "ops") + os.sep


class _TracebackFrame(Protocol):
    @property
    def file_name(self) -> str: ...
    @property
    def line_num(self) -> int: ...
    @property
    def function_name(self) -> str: ...


class JaxTraceback(Protocol):
    """What is read of an equation's traceback (jaxlib's `Traceback`): its frames,
    innermost first (and `raw_frames()`, where this jaxlib has it, for columns)."""

    @property
    def frames(self) -> Sequence[_TracebackFrame]: ...


def _is_user_file(path: str) -> bool:
    if path.startswith(_SHIPPED_KERNELS):
        return True
    if path.startswith(_EXCLUDED_PREFIXES):
        return False
    return not any(part in path for part in _EXCLUDED_PARTS)


def _frame(file: str, line: int, function: str, column: int = 0) -> SourceFrame:
    code = linecache.getline(file, line).strip() if line > 0 else ""
    return SourceFrame(file=file, line=line, function=function, code=code, column=column)


def _column(raw: Any, i: int) -> int:
    """1-based column of frame i's instruction (its code's positions; `raw` is the
    traceback's (codes, last instructions)), 0 when unknown."""
    try:
        codes, lastis = raw
        position = next(itertools.islice(codes[i].co_positions(), lastis[i] // 2, None))
    except (AttributeError, IndexError, TypeError, ValueError, StopIteration):
        return 0
    return position[2] + 1 if position[2] is not None else 0


@functools.lru_cache(maxsize=65536)
def _user_frames_cached(traceback: JaxTraceback | None, limit: int) -> tuple[SourceFrame, ...]:
    frames: list[SourceFrame] = []
    if traceback is None:
        return ()
    raw = None
    for i, tb_frame in enumerate(traceback.frames):
        path = tb_frame.file_name
        if not _is_user_file(path):
            continue
        if raw is None:
            raw = traceback.raw_frames() if hasattr(traceback, "raw_frames") else ()
        frames.append(_frame(path, tb_frame.line_num, tb_frame.function_name,
                             _column(raw, i)))
        if len(frames) >= limit:
            break
    return tuple(frames)


def user_frames(source_info: object, limit: int = 4) -> tuple[SourceFrame, ...]:
    """Innermost-first user frames of an equation's source_info (empty when unknown)."""
    traceback = getattr(source_info, "traceback", None)
    if traceback is None:
        return ()
    try:
        return _user_frames_cached(traceback, limit)
    except TypeError:  # unhashable traceback object in some JAX builds
        return _user_frames_cached.__wrapped__(traceback, limit)


def parse_src_info(func_src_info: str | None) -> tuple[str, str, int]:
    """Split JAX's 'name at file:line' into (name, file, line)."""
    if not func_src_info:
        return ("kernel", "", 0)
    name, _, where = func_src_info.partition(" at ")
    file, _, line = where.rpartition(":")
    try:
        return (name, file, int(line))
    except ValueError:
        return (name, where, 0)


def code_line(file: str, line: int) -> str:
    """The stripped source text of a line ('' when unknown)."""
    return linecache.getline(file, line).strip() if file and line > 0 else ""
