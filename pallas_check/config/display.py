"""Where a report for people is shown: its width, its colours, whether it can draw boxes.

Probed once, here, for every table (`run`, `diff`, `compile`): the width by
`shutil.get_terminal_size` (`COLUMNS` first, then the terminal stdout is, else the width of
a file), the colours by rich's own Console on the real destination, so that a terminal gets
styles and a pipe or a file none, with `NO_COLOR`, `FORCE_COLOR` and `TERM=dumb` read the
way rich reads them. The report is rendered into a string first (it is delivered later), so
the Console that renders it is told what the destination's Console decided.
"""

from __future__ import annotations

import dataclasses
import shutil
from typing import Literal, TextIO, cast

from rich.console import Console

FILE_WIDTH = 120  # a file or a pipe: the width of CI logs, pre-commit output and diffs
ColorSystem = Literal["auto", "standard", "256", "truecolor", "windows"]  # rich's names


def terminal_width() -> int:
    """Columns of the terminal stdout is (or `COLUMNS`); FILE_WIDTH when it is no terminal."""
    return shutil.get_terminal_size((FILE_WIDTH, 24)).columns


@dataclasses.dataclass(frozen=True)
class Display:
    """What a report is rendered for. The default is a file: FILE_WIDTH columns, no styles."""

    width: int = FILE_WIDTH
    color_system: ColorSystem | None = None  # rich's name ("truecolor", "256", ...) or None
    no_color: bool = False  # NO_COLOR: styles without colours (bold stays), as rich does
    ascii_only: bool = False  # the destination cannot encode box-drawing characters

    def console(self, file: TextIO) -> Console:
        """A Console writing to `file` (usually a string buffer) as to the destination.
        Never rich's Jupyter mode: inside an IPython kernel rich would send each line to
        the notebook as its own display_data instead of writing it to `file`."""
        return Console(file=file, width=self.width, color_system=self.color_system,
                       no_color=self.no_color, highlight=False, soft_wrap=False,
                       emoji=False, legacy_windows=False, markup=False,
                       force_jupyter=False)


def display_for(stream: TextIO | None) -> Display:
    """The Display of a destination stream (sys.stdout); None: a file written by -o."""
    if stream is None:
        return Display()
    probe = Console(file=stream)  # rich decides: isatty, NO_COLOR, FORCE_COLOR, TERM
    encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
    # rich's property is typed `str | None`; its values are its ColorSystem enum's names
    color_system = cast("ColorSystem | None", probe.color_system)
    return Display(width=terminal_width(), color_system=color_system,
                   no_color=probe.no_color, ascii_only=not encoding.startswith("utf"))
