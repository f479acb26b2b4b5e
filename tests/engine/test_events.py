"""The engine's listener seam (engine/events.py): typed, and no listener, no call."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import pallas_check.checkers as checkers
from pallas_check.config import Config
from pallas_check.engine import events
from pallas_check.engine.call import event_data, simulate
from pallas_check.engine.call import state as state_module
from pallas_check.intercept.session import Session

EVENTS = Path(events.__file__)
VERDICTS = EVENTS.with_name("verdicts.py")  # the events of what checkers decide


@pytest.mark.parametrize("module", [EVENTS, VERDICTS], ids=lambda p: p.name)
def test_the_event_protocol_has_no_any(module):
    """Every event field and listener method is typed: no `Any` anywhere in the modules."""
    tree = ast.parse(module.read_text())
    names = [node for node in ast.walk(tree)
             if isinstance(node, ast.Name) and node.id == "Any"
             or isinstance(node, ast.Attribute) and node.attr == "Any"
             or isinstance(node, ast.alias) and node.name == "Any"]
    assert names == []
    for node in ast.walk(tree):  # annotations written as strings too
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            assert "Any" not in node.value.split("[")[0].split(" | "), node.value


def test_every_event_kind_has_its_class_and_method():
    """One registry: each kind has exactly one class and each class one kind; each kind
    `Listener` declares names its class in its method's annotation."""
    assert set(events.KIND_OF.values()) == set(events.EVENT_KINDS)
    assert len(events.KIND_OF) == len(events.CLASS_OF) == len(events.EVENT_KINDS)
    for kind, cls in events.CLASS_OF.items():
        assert events.KIND_OF[cls] == kind
    declared = [name[3:] for name in vars(events.Listener) if name.startswith("on_")]
    assert set(declared) <= set(events.EVENT_KINDS)
    assert _Misaligned in events.KIND_OF  # (registered by this module, declared by no Listener)
    for kind in declared:
        cls = events.CLASS_OF[kind]
        assert getattr(events.Listener, "on_" + kind).__annotations__["event"] == cls.__name__


# -- an event kind declared where it is built: one engine module, no edit of events.py ----
# Declared at import, as an engine module declares one. It stays registered for the rest
# of the test session: harmless, since no other listener takes it (its feed is empty).
@events.event_kind
class _Misaligned(NamedTuple):
    buffer: str
    offset: int


class _TakesMisaligned(events.Listener):
    def __init__(self) -> None:
        self.seen: list[_Misaligned] = []

    def on__misaligned(self, event: _Misaligned) -> None:
        self.seen.append(event)


def test_an_event_declared_outside_events_py_reaches_its_listener():
    assert events.KIND_OF[_Misaligned] == "_misaligned"  # (the kind from the class name)
    taker, silent = _TakesMisaligned(), _Silent()
    _Silent.touched = []
    assert "_misaligned" in events.kinds_taken(_TakesMisaligned)
    assert "_misaligned" not in events.kinds_taken(_Silent)
    feeds = events.Feeds((silent, _AccessesOnly(), taker))
    assert feeds.takes(_Misaligned) and not feeds.takes(events.CallSkipped)
    event = _Misaligned("x_ref", 3)
    state_module.CallState.tell(SimpleNamespace(feeds=feeds), event)  # as the engine tells it
    assert taker.seen == [event]
    assert _Silent.touched == []  # never looked up: not for this kind, nor any other
    nobody = events.Feeds((silent,))
    assert nobody._misaligned == () and not nobody.takes(_Misaligned)
    state_module.CallState.tell(SimpleNamespace(feeds=nobody), event)
    assert taker.seen == [event] and _Silent.touched == []


def test_a_kind_can_be_registered_once():
    with pytest.raises(ValueError, match="'access' is already"):
        events.event_kind(kind="access")(NamedTuple("Access", [("actor", str)]))
    with pytest.raises(ValueError, match="'_misaligned' is already"):
        events.event_kind(NamedTuple("_Misaligned", [("buffer", str)]))  # another module's
    with pytest.raises(ValueError, match="already registered"):
        events.event_kind(kind="misaligned_again")(_Misaligned)
    with pytest.raises(ValueError, match="a name `Feeds` uses"):
        events.event_kind(kind="takes")(NamedTuple("Takes", [("actor", str)]))
    with pytest.raises(TypeError, match="NamedTuples"):
        events.event_kind(type("NotATuple", (), {}))
    assert "misaligned_again" not in events.EVENT_KINDS and "takes" not in events.EVENT_KINDS


@pytest.fixture
def late_kind():
    """An event kind registered after listeners and feeds were seen (its engine module
    imported during a call); removed again after the test."""
    yield events.event_kind(kind="late_moment")(NamedTuple("LateMoment", [("n", int)]))
    cls = events.CLASS_OF.pop("late_moment")
    del events.KIND_OF[cls]
    events.kinds_taken.cache_clear()


def test_a_kind_registered_late_is_still_fed(request):
    class TakesLate(events.Listener):
        def __init__(self) -> None:
            self.seen: list[tuple[int, ...]] = []

        def on_late_moment(self, event: tuple[int, ...]) -> None:
            self.seen.append(event)

    taker = TakesLate()
    before = events.kinds_taken(TakesLate)  # cached before the kind exists
    feeds = events.Feeds((_Silent(), taker))  # made before too
    _Silent.touched = []
    late = request.getfixturevalue("late_kind")
    assert "late_moment" not in before and "late_moment" in events.kinds_taken(TakesLate)
    assert feeds.takes(late)
    state_module.CallState.tell(SimpleNamespace(feeds=feeds), late(7))
    assert taker.seen == [late(7)] and _Silent.touched == []
    assert events.Feeds((taker,)).late_moment == (taker.on_late_moment,)


def _copy_kernel(x_ref, o_ref, scratch, sem):
    copy = pltpu.make_async_copy(x_ref, scratch, sem)
    copy.start()
    copy.wait()
    o_ref[...] = scratch[...] * 2


def _call(x):
    return pl.pallas_call(
        _copy_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        scratch_shapes=[pltpu.VMEM(x.shape, x.dtype), pltpu.SemaphoreType.DMA(())],
    )(x)


def _run(config: Config) -> np.ndarray:
    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
    session = Session(config)
    with session.install():
        out = np.asarray(jax.block_until_ready(_call(x)))
    assert session.findings == [] and session.engine_error is None
    np.testing.assert_array_equal(out, np.asarray(x) * 2)
    return out


class _Silent(events.Listener):
    """Takes no event kind: any `on_...` looked up on it is a call the engine should not
    have made."""

    touched: list[str] = []

    def __getattribute__(self, name: str):
        if name.startswith("on_"):
            _Silent.touched.append(name)
        return object.__getattribute__(self, name)


class _AccessesOnly(events.Listener):
    seen: list[type] = []

    def on_access(self, event: events.Access) -> None:
        _AccessesOnly.seen.append(type(event))


def test_a_listener_taking_no_event_kind_is_never_called(monkeypatch):
    made = checkers.Checkers.listeners

    def with_ours(self, call, sink):
        return made(self, call, sink) + (_Silent(), _AccessesOnly())

    monkeypatch.setattr(checkers.Checkers, "listeners", with_ours)
    _Silent.touched, _AccessesOnly.seen = [], []
    _run(Config(races=True, timeline=True))
    assert _Silent.touched == []
    assert _AccessesOnly.seen and set(_AccessesOnly.seen) == {events.Access}


def test_with_races_off_no_access_event_is_built(monkeypatch):
    """No listener takes accesses: the per-access feed is an empty tuple, and the engine
    never builds an Access event."""
    states = []

    class Recorded(simulate.CallState):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            states.append(self)

    def refuse(*args, **kwargs):
        raise AssertionError("an Access event was built with races off")

    monkeypatch.setattr(simulate, "CallState", Recorded)
    monkeypatch.setattr(state_module, "Access", refuse)
    monkeypatch.setattr(event_data, "Access", refuse)
    _run(Config(races=False))
    assert states and all(state.feeds.access == () for state in states)
    assert all(state.races is None for state in states)
