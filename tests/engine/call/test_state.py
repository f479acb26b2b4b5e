"""engine/call/state.py's CallState: which listeners a simulation makes. Races are checked
in the runs that report (a schedule's main run) and not in the re-runs that only compare
outputs (the second fill, a revisit's perturbation), whose findings are dropped: there
the race checker would only cost time."""

from __future__ import annotations

import pytest

from pallas_check.checkers import CHECKERS, RaceChecker
from pallas_check.config import Config
from pallas_check.engine.call.parts import Simulation
from pallas_check.engine.call.state import CallState
from pallas_check.findings.finding import KernelInfo


def _state(races: bool, report: bool) -> CallState:
    return CallState(Simulation(Config(races=races), "nan", KernelInfo("kernel"), 0, report,
                                CHECKERS))


@pytest.mark.parametrize("races, report, checked", [(True, True, True), (True, False, False),
                                                    (False, True, False)])
def test_races_are_checked_in_the_runs_that_report(races, report, checked):
    state = _state(races, report)
    takers = state.feeds.access
    assert (state.races is not None) == checked
    assert [type(getattr(t, "__self__", None)) for t in takers] == (
        [RaceChecker] if checked else [])
