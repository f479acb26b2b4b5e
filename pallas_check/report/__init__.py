"""Reporters: each renders a finished report in one format (one module per format, and
per command's report). The registry of formats, and which command's report each renders,
is `Format` (config/formats.py)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from pallas_check.config.formats import RUN, Format, Reporter, render

if TYPE_CHECKING:
    from pallas_check.config.display import Display

FORMATS = tuple(fmt.value for fmt in Format.accepted_by(RUN))  # the names `--format` accepts


def reporter_for(fmt: str, *, ascii_only: bool = False, width: int | None = None,
                 display: Display | None = None) -> Reporter:
    """The reporter of the run report in a format name ('table', 'json', ...). `display`
    (report.console.Display: width, colours, boxes), ascii_only and width describe where a
    table will be shown; the other formats ignore them."""
    if ascii_only or width is not None:
        from pallas_check.config.display import Display  # lazy: rich; the CLI loads this package

        display = display if display is not None else Display()
        display = dataclasses.replace(
            display, ascii_only=ascii_only or display.ascii_only,
            width=width if width is not None else display.width)
    return Format(fmt).reporter(RUN, display=display)


__all__ = ["FORMATS", "Format", "Reporter", "render", "reporter_for"]
