"""session: the heap is handed back to the OS after calls, at most once per
TRIM_INTERVAL_S (a trim walks the whole heap, and the pages it returns fault back in at the
next call: back-to-back small calls share one), and always after a call that ran longer."""

from __future__ import annotations

import types

from pallas_check import session


def test_freed_memory_is_returned_at_most_once_per_interval(monkeypatch):
    trims: list[int] = []
    clock = [1000.0]
    monkeypatch.setattr(session, "_malloc_trim", lambda: trims.append)
    monkeypatch.setattr(session, "_last_trim", [float("-inf")])
    monkeypatch.setattr(session, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))

    session._return_freed_memory()  # the first call of a run
    assert trims == [0]
    for _ in range(5):  # small calls, 20 ms each
        clock[0] += 0.02
        session._return_freed_memory()
    assert trims == [0]
    clock[0] += session.TRIM_INTERVAL_S  # a call as long as the interval
    session._return_freed_memory()
    assert trims == [0, 0]
