"""host_memory (what intercept/session.py does around each call): the heap is handed back to the OS after calls, at most once per
TRIM_INTERVAL_S (a trim walks the whole heap, and the pages it returns fault back in at the
next call: back-to-back small calls share one), and always after a call that ran longer;
Python's cyclic collector is paused while a call is simulated and left as it was found."""

from __future__ import annotations

import types

import jax

from pallas_check.process import host_memory as session


def test_freed_memory_is_returned_at_most_once_per_interval(monkeypatch):
    trims: list[int] = []
    clock = [1000.0]
    monkeypatch.setattr(session, "_malloc_trim", lambda: trims.append)
    monkeypatch.setattr(session, "_last_trim", [float("-inf")])
    monkeypatch.setattr(session, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))

    session.return_freed_memory()  # the first call of a run
    assert trims == [0]
    for _ in range(5):  # small calls, 20 ms each
        clock[0] += 0.02
        session.return_freed_memory()
    assert trims == [0]
    clock[0] += session.TRIM_INTERVAL_S  # a call as long as the interval
    session.return_freed_memory()
    assert trims == [0, 0]


def test_a_trim_at_once_runs_within_the_interval_and_leaves_the_schedule_as_it_was(monkeypatch):
    """The compiled tier trims at once after a build (intercept/tiers.py): that trim runs
    whatever the interval, and the trim after the call that follows still runs."""
    trims: list[int] = []
    clock = [1000.0]
    monkeypatch.setattr(session, "_malloc_trim", lambda: trims.append)
    monkeypatch.setattr(session, "_last_trim", [float("-inf")])
    monkeypatch.setattr(session, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))

    session.return_freed_memory()  # a call
    clock[0] += 0.02
    session.return_freed_memory(at_once=True)  # a build, within the interval
    assert trims == [0, 0]
    # The call after the build, less than the interval after the build's trim but not
    # after the last scheduled one.
    clock[0] += session.TRIM_INTERVAL_S - 0.01
    session.return_freed_memory()
    assert trims == [0, 0, 0]
    clock[0] += 0.02
    session.return_freed_memory(at_once=True)  # another build
    session.return_freed_memory()  # its call, quick: within the interval of the last one
    assert trims == [0, 0, 0, 0]


def test_the_collector_is_paused_during_a_call_and_restored_after():
    import gc

    assert gc.isenabled()
    with session.collector_paused():
        assert not gc.isenabled()
        with session.collector_paused():  # a second call in flight (another thread)
            assert not gc.isenabled()
        assert not gc.isenabled()  # still one call in flight
    assert gc.isenabled()
    gc.disable()  # a script that runs without the collector keeps it off
    try:
        with session.collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_checked_call_leaves_the_collector_as_it_found_it(check):
    import gc

    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0

    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))
    x = jnp.ones((8, 128), jnp.float32)
    assert float(check(call, x).value[0, 0]) == 2.0 and gc.isenabled()
    gc.disable()
    try:
        assert float(check(call, x).value[0, 0]) == 2.0 and not gc.isenabled()
    finally:
        gc.enable()
