"""The engine's listener seam (engine/events.py): typed, and no listener, no call."""

from __future__ import annotations

import ast
from pathlib import Path

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
from pallas_check.session import Session

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
    assert set(events.KIND_OF.values()) == set(events.EVENT_KINDS)
    for cls, kind in events.KIND_OF.items():
        assert getattr(events.Listener, "on_" + kind).__annotations__["event"] == cls.__name__


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
