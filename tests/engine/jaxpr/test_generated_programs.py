"""engine/evaluate's generated programs and the scalar-load shortcut: results equal a
numpy reference, and every load the shortcut does not cover (past the end, of memory not
yet written) still gets its finding from the general rule; with races on, the shortcut's
loads reach the race checker as the general rule's do, except those of buffers no race
can involve, which it counts."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_check.checkers.races import RaceChecker
from pallas_check.config import Config
from pallas_check.engine.rules import access as access_rules

ROWS = 8


def _table_rows_kernel(t_ref, x_hbm, o_ref, s_ref):
    """Row r of the output: 2 * t[1, r] + t[0, 7 - r] + s[0], by dynamic scalar loads."""
    s_ref[0] = t_ref[2, 3]

    def row(r, carry):
        value = t_ref[1, r] * 2 + t_ref[0, 7 - r] + s_ref[0]
        o_ref[pl.ds(r, 1), :] = jnp.full((1, 128), value, jnp.float32)
        return carry

    jax.lax.fori_loop(0, ROWS, row, 0)


def _past_the_end_kernel(t_ref, x_hbm, o_ref, s_ref):
    def row(r, carry):
        value = t_ref[1, r + 1]  # r = 7 reads t[1, 8]: one past the end
        o_ref[pl.ds(r, 1), :] = jnp.full((1, 128), value, jnp.float32)
        return carry

    jax.lax.fori_loop(0, ROWS, row, 0)


def _unwritten_kernel(t_ref, x_hbm, o_ref, s_ref):
    s_ref[0] = t_ref[0, 0]
    o_ref[...] = jnp.full((ROWS, 128), s_ref[0] + s_ref[1], jnp.float32)  # s[1]: never written


def _line_of(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def _call(table_call, kernel):
    return table_call(kernel, ROWS, [pltpu.SMEM((2,), jnp.int32)])


@pytest.fixture
def general_loads(monkeypatch):
    """How many loads reach the general `_get` rule (the shortcut falls back to it)."""
    calls = []
    general = access_rules._get

    def counting(ctx, eqn, invals):
        calls.append(eqn.outvars[0].aval.shape)
        return general(ctx, eqn, invals)

    monkeypatch.setattr(access_rules, "_get", counting)
    return calls


def _table():
    return jnp.arange(32, dtype=jnp.int32).reshape(4, 8) * 3 - 7


def test_scalar_loads_take_the_shortcut_and_give_the_reference(check, table_call,
                                                               general_loads):
    table = _table()
    x = jnp.zeros((8, 128), jnp.float32)
    r = check(_call(table_call, _table_rows_kernel), table, x, config=Config(races=False))
    assert r.findings == []
    t = np.asarray(table)
    expected = np.array([2 * t[1, i] + t[0, 7 - i] + t[2, 3] for i in range(ROWS)], np.float32)
    np.testing.assert_array_equal(np.asarray(r.value), np.repeat(expected[:, None], 128, 1))
    # The table is written everywhere: its loads take the shortcut. s_ref is not (s[1] never
    # is), so each s[0] load goes the general way, which checks the written-shadow.
    assert general_loads == [()] * ROWS


def test_with_races_on_the_shortcut_still_hands_every_load_to_the_race_checker(
        check, table_call, general_loads, monkeypatch):
    seen = []
    on_access = RaceChecker.on_access

    def recording(self, event):
        if not event.is_write and event.buffer in ("t_ref", "s_ref"):
            seen.append((event.buffer, event.index_range))
        return on_access(self, event)

    monkeypatch.setattr(RaceChecker, "on_access", recording)
    # (as a listener that wants every access: the race checker itself is not handed those
    # of buffers no race can involve, the next test)
    monkeypatch.setattr(RaceChecker, "needs_unwritten_accesses", True)
    r = check(_call(table_call, _table_rows_kernel), _table(),
              jnp.zeros((8, 128), jnp.float32), config=Config(races=True))
    assert r.findings == []
    # The table is written everywhere: its loads take the shortcut, races on as off; s[0]
    # goes the general way (s[1] is never written).
    assert general_loads == [()] * ROWS
    table_reads = [((2, 3), (3, 4))]
    for i in range(ROWS):
        table_reads += [((1, 2), (i, i + 1)), ((0, 1), (7 - i, 8 - i))]
    assert [rng for name, rng in seen if name == "t_ref"] == table_reads
    assert [rng for name, rng in seen if name == "s_ref"] == [((0, 1),)] * ROWS


def test_loads_no_race_can_involve_are_counted_not_handed_to_the_race_checker(
        check, table_call, monkeypatch):
    """t_ref (scalar prefetch: nothing writes it in the call) and s_ref (the core's own
    SMEM scratch: no DMA, no other actor touches it) can be in no race
    (engine/call/unraced.py): their accesses build no event, and the race checker counts
    them all the same, as many as when it is handed every access."""
    seen: list[str] = []
    checked: list[int] = []
    on_access, init = RaceChecker.on_access, RaceChecker.__init__

    def recording(self, event):
        seen.append(event.buffer)
        return on_access(self, event)

    def kept(self, *args):
        init(self, *args)
        checkers.append(self)

    monkeypatch.setattr(RaceChecker, "on_access", recording)
    monkeypatch.setattr(RaceChecker, "__init__", kept)
    for wants_all in (False, True):
        checkers: list[RaceChecker] = []
        monkeypatch.setattr(RaceChecker, "needs_unwritten_accesses", wants_all)
        r = check(_call(table_call, _table_rows_kernel), _table(),
                  jnp.zeros((8, 128), jnp.float32), config=Config(races=True))
        assert r.findings == []
        checked.append(sum(c.checked for c in checkers))
        if not wants_all:
            assert "t_ref" not in seen and "s_ref" not in seen, seen
    assert {"t_ref", "s_ref"} <= set(seen)  # (handed over when every access is wanted)
    assert checked[0] == checked[1] >= 1 + 3 * ROWS + 1  # t[2,3], per row 2 t + s, s[0]=


def test_a_scalar_load_past_the_end_is_out_of_bounds(check, table_call):
    r = check(_call(table_call, _past_the_end_kernel), _table(),
              jnp.zeros((8, 128), jnp.float32), config=Config())
    [finding] = r.findings
    assert finding.kind.value == "out-of-bounds" and finding.buffer == "t_ref"
    assert finding.index_range == ((1, 2), (8, 9))
    assert finding.frames[0].line == _line_of(_past_the_end_kernel, "t_ref[1, r + 1]")


def test_a_scalar_load_of_memory_never_written_is_uninitialized(check, table_call):
    r = check(_call(table_call, _unwritten_kernel), _table(),
              jnp.zeros((8, 128), jnp.float32), config=Config())
    [finding] = r.findings
    assert finding.kind.value == "uninitialized" and finding.buffer == "s_ref"
    assert finding.index_range == ((1, 2),)
    assert finding.frames[0].line == _line_of(_unwritten_kernel, "s_ref[0] + s_ref[1]")


def _gather_rows_kernel(t_ref, x_hbm, o_ref, buf, sems):
    """Rows of x named by t[0, :8], two at a time into a double buffer: a DMA per row, the
    slot's pair waited before the next pair reuses it."""
    def copy(i):
        return pltpu.make_async_copy(x_hbm.at[pl.ds(t_ref[0, i], 1)],
                                     buf.at[i % 2, pl.ds(0, 1)], sems.at[i % 2])

    for i in range(ROWS):
        copy(i).start()
        copy(i).wait()
        o_ref[pl.ds(i, 1), :] = buf[i % 2, pl.ds(0, 1)] * 2.0


def _stride_0_source_kernel(t_ref, x_hbm, o_ref, buf, sems):
    copy = pltpu.make_async_copy(x_hbm.at[pl.ds(0, ROWS, 0)], buf.at[0], sems.at[0])
    copy.start()
    copy.wait()
    o_ref[...] = buf[0]


def _dma_call(table_call, kernel):
    return table_call(kernel, ROWS, [pltpu.VMEM((2, ROWS, 128), jnp.float32),
                                     pltpu.SemaphoreType.DMA((2,))])


@pytest.fixture
def general_dmas(monkeypatch):
    """Which DMA equations reach the general start and wait rules."""
    from pallas_check.engine.rules import dma as dma_rules

    calls = []
    for name in ("_dma_start", "_dma_wait"):
        general = getattr(dma_rules, name)

        def counting(ctx, eqn, invals, general=general, name=name):
            calls.append(name)
            return (yield from general(ctx, eqn, invals))

        monkeypatch.setattr(dma_rules, name, counting)
    return calls


@pytest.mark.parametrize("mode", ["on_wait", "eager"])
def test_local_dmas_take_the_planned_path_and_copy_the_named_rows(check, table_call,
                                                                  general_dmas, mode):
    table = _table() % 16 + 16
    x = jax.random.normal(jax.random.key(3), (64, 128), jnp.float32)
    r = check(_dma_call(table_call, _gather_rows_kernel), table, x,
              config=Config(dma_mode=mode))
    assert r.findings == []
    rows = np.asarray(table)[0, :ROWS]
    np.testing.assert_array_equal(np.asarray(r.value), np.asarray(x)[rows] * 2.0)
    assert general_dmas == []


def test_a_stride_0_dma_source_falls_back_and_is_refused(check, table_call, general_dmas):
    with pytest.raises(Exception, match="a DMA slice with a stride of 0"):
        check(_dma_call(table_call, _stride_0_source_kernel), _table(),
              jnp.zeros((64, 128), jnp.float32))
    assert general_dmas == ["_dma_start"]
