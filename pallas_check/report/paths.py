"""How reports for people show a file: relative to the project root when inside it, else
absolute, the same way in every line of every such format (table, text, diff, compile).

The project root is the folder of the nearest pyproject.toml above the script, else the
git root above it, else the current folder: the paths a reviewer sees in CI are then the
paths of the repository, wherever the command was started.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path


@functools.lru_cache(maxsize=64)
def project_root(script: str | None = None) -> Path:
    """The root that `display_path` shows files relative to (see the module docstring)."""
    cwd = Path.cwd()
    if not script:
        return cwd
    start = Path(os.path.abspath(script)).parent
    for marker in ("pyproject.toml", ".git"):
        for folder in (start, *start.parents):
            if (folder / marker).exists():
                return folder
    return cwd


def display_path(file: str, root: Path | None = None) -> str:
    """`file` relative to `root` (default: the current folder) when below it, else absolute."""
    if not file:
        return "?"
    if file.startswith("<"):  # "<string>", "<stdin>": not a file
        return file
    absolute = Path(os.path.abspath(file))
    try:
        return str(absolute.relative_to(root if root is not None else Path.cwd()))
    except ValueError:  # elsewhere (or another drive)
        return str(absolute)


# An absolute path inside a message, up to a ':' (file:line), a space or a quote.
_ABSOLUTE = re.compile(r"(?<![\w.~])/[^\s:'\"(),\[\]]+")


def display_text(message: str, root: Path | None = None) -> str:
    """A message with each absolute path in it shown as `display_path` shows it (a DMA's
    actor names the line that started it)."""
    base = root if root is not None else Path.cwd()

    def shown(match: re.Match[str]) -> str:
        try:
            return str(Path(match.group(0)).relative_to(base))
        except ValueError:  # not below the root: as written
            return match.group(0)

    return _ABSOLUTE.sub(shown, message)
