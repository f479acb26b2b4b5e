"""Explicit MXU operations against JAX's rules for them, and MXUs left holding data when
the kernel ends (the events of engine/rules/mxu.py): an `mxu-misuse` finding each."""

from __future__ import annotations

from pallas_check.checkers.base import Checker
from pallas_check.engine.rules.mxu import MxuMisuse  # declared where it is built
from pallas_check.findings.finding import Finding, FindingKind

MEMORY_SPACE = "MXU"  # the finding's memory space: an MXU's registers, not a buffer


class MxuChecker(Checker):
    def on_mxu_misuse(self, event: MxuMisuse) -> None:
        where = event.where
        self.sink.emit(Finding(
            kind=FindingKind.MXU_MISUSE, message=event.message, kernel=self.call.kernel,
            call_index=self.call.call_index, grid_point=where.grid_point, actor=where.actor,
            buffer=event.part, memory_space=MEMORY_SPACE, index_range=event.addresses,
            frames=where.frames, help=event.help))
