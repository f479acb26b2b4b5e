"""What a reporter is given: the findings and the facts of the run, nothing live."""

from __future__ import annotations

import dataclasses
from typing import Any

from pallas_check.findings import Finding
from pallas_check.session import CallSummary


@dataclasses.dataclass
class RunReport:
    script: str
    config: dict[str, Any]
    findings: list[Finding]
    calls: list[CallSummary]
    exit_code: int
    user_error: str | None = None
    user_traceback: str | None = None
    internal_error: str | None = None
    partial: bool = False
