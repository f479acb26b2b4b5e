"""process/children.py: what a child process checked reaches its owner whole, as written,
through the file it leaves in the run's folder (the owner's report lists those calls)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from pallas_check.findings.finding import CallSummary, Finding
from pallas_check.process.children import ChildFindings, adopt_children


class _Owner:
    """The owner's session, as adopt_children sees it: it takes calls and findings."""

    def __init__(self) -> None:
        self.calls: list[CallSummary] = []
        self.findings: list[Finding] = []

    def adopt(self, calls: Sequence[CallSummary], findings: Sequence[Finding]) -> None:
        self.calls.extend(calls)
        self.findings.extend(findings)


def test_a_childs_calls_keep_their_tier_and_its_reason(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    calls = [CallSummary(0, "k", "k.py", 3, (4,), 0.5, 0, tier="compiled"),
             CallSummary(1, "k", "k.py", 3, (4,), 0.5, 1, tier="engine",
                         tier_reason="a verdict bit: out-of-bounds")]
    ChildFindings(folder).write(calls, [])
    owner = _Owner()
    adopt_children(owner, folder)
    assert [(c.index, c.tier, c.tier_reason) for c in owner.calls] == [
        (0, "compiled", ""), (1, "engine", "a verdict bit: out-of-bounds")]
    assert owner.calls == calls  # every other field as written, too
    assert not folder.exists()  # the owner reports once
