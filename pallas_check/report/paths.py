"""How reports show a file: relative to the current folder when inside it, else absolute,
the same way in every line of every format for people (table, text)."""

from __future__ import annotations

import os


def display_path(file: str) -> str:
    if not file:
        return "?"
    try:
        absolute = os.path.abspath(file)
        rel = os.path.relpath(absolute)
    except ValueError:  # another drive
        return file
    return absolute if rel.startswith("..") else rel


def display_text(message: str) -> str:
    """A message with the absolute paths of files under the current folder made relative,
    as `display_path` shows them (a DMA's actor names the line that started it)."""
    prefix = os.getcwd().rstrip(os.sep) + os.sep
    return message.replace(prefix, "") if prefix != os.sep else message
