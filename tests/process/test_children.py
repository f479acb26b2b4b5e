"""process/children.py: what a child process checked reaches its owner whole, as written,
through the file it leaves in the run's folder (the owner's report lists those calls)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import pytest

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


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # (the child runs no JAX)
def test_a_stop_while_a_forked_child_undoes_the_run_comes_back_once_it_is_undone(
        tmp_path: Path) -> None:
    """A child forked during a run first undoes what the run set up (its handlers, the
    watchdog's wakeup socket). A stop that arrives meanwhile, while our handler is still
    the child's (Pool.terminate's SIGTERM to a worker it just forked), interrupts a step:
    the step is done again, the others still run, and the signal is sent again once the
    child's own handler is back -- here SIGTERM's default, so the child ends by it (before,
    the KeyboardInterrupt cut the undoing short and the child went on with our handler)."""
    import os
    import signal

    from pallas_check.process import children, interrupts

    done = tmp_path / "undone.txt"
    stopped = [False]

    def interrupted_once() -> None:
        with done.open("a") as f:
            f.write("first\n")
        if not stopped[0]:
            stopped[0] = True
            interrupts._received.append(signal.SIGTERM)  # (as our handler records it)
            raise KeyboardInterrupt

    def later() -> None:  # (registered first: undone last)
        with done.open("a") as f:
            f.write("later\n")

    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)  # (the child's own handler)
    try:
        with (children.owned(), children.undone_in_child(later),
              children.undone_in_child(interrupted_once)):
            pid = os.fork()
            if pid == 0:  # (only if the signal was not sent again)
                os._exit(7)
            _, status = os.waitpid(pid, 0)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, status
    assert done.read_text().split() == ["first", "first", "later"]
