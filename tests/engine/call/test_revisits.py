"""Output blocks revisited after other blocks (issue 25, items 3 and 8).

A TPU pipeline writes an output block back when its index changes and reads it back in
only under `pl.Buffered(1, revisit=pl.RevisitMode.ANY)`. Token tiles in group order
0, 1, 0, 1 (an MoE combine over unsorted groups) visit each group's block twice. Whether
the first visit's work survives is decided by data flow (a re-run with its input blocks
perturbed), not by the shape of the writes: a block re-zeroed at its revisit is written
whole there and loses tile 0; partial sums in scratch (written at every visit, or at the
last) or a block read back under ANY keep it.
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_check.engine.call import explore
from pallas_check.config import Config, DmaMode
from pallas_check.intercept.session import Session

MODES = [DmaMode.ON_WAIT, DmaMode.EAGER, DmaMode.RANDOM]
UNSORTED = np.array([0, 1, 0, 1], np.int32)
SORTED = np.array([0, 0, 1, 1], np.int32)
G = 2


def _flags(groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per tile: is it its group's first tile, its last?"""
    g = groups.tolist()
    first = [int(v not in g[:i]) for i, v in enumerate(g)]
    last = [int(v not in g[i + 1:]) for i, v in enumerate(g)]
    return np.array(first, np.int32), np.array(last, np.int32)


def reinit_kernel(g_ref, f_ref, l_ref, x_ref, o_ref, acc_ref):
    i = pl.program_id(0)

    @pl.when(jnp.logical_or(i == 0, g_ref[i] != g_ref[jnp.maximum(i - 1, 0)]))
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += x_ref[...]


def scratch_every_visit_kernel(g_ref, f_ref, l_ref, x_ref, o_ref, acc_ref):
    i, g = pl.program_id(0), g_ref[pl.program_id(0)]

    @pl.when(f_ref[i] == 1)
    def _():
        acc_ref[g] = jnp.zeros(acc_ref.shape[1:], acc_ref.dtype)

    acc_ref[g] += x_ref[...]
    o_ref[...] = acc_ref[g]


def scratch_last_visit_kernel(g_ref, f_ref, l_ref, x_ref, o_ref, acc_ref):
    i, g = pl.program_id(0), g_ref[pl.program_id(0)]

    @pl.when(f_ref[i] == 1)
    def _():
        acc_ref[g] = jnp.zeros(acc_ref.shape[1:], acc_ref.dtype)

    acc_ref[g] += x_ref[...]

    @pl.when(l_ref[i] == 1)
    def _():
        o_ref[...] = acc_ref[g]


def read_back_kernel(g_ref, f_ref, l_ref, x_ref, o_ref, acc_ref):
    i = pl.program_id(0)

    @pl.when(f_ref[i] == 1)
    def _():
        o_ref[...] = x_ref[...]

    @pl.when(f_ref[i] == 0)
    def _():
        o_ref[...] += x_ref[...]  # READ-BACK


def running_max_kernel(g_ref, f_ref, l_ref, x_ref, o_ref, acc_ref):
    """A running maximum by comparison: NaN in a tile never wins `x > best`, so only a
    larger perturbation shows that tile 0 reaches the result."""
    i, g = pl.program_id(0), g_ref[pl.program_id(0)]

    @pl.when(f_ref[i] == 1)
    def _():
        acc_ref[g] = x_ref[...]

    best = acc_ref[g]
    acc_ref[g] = jnp.where(x_ref[...] > best, x_ref[...], best)
    o_ref[...] = acc_ref[g]


def skip_padding_kernel(g_ref, f_ref, l_ref, x_ref, o_ref, acc_ref):
    """Tile 0 is padding (l_ref: the tile is real, f_ref: its group's first real tile):
    group 0's first visit does nothing with its input, so it has nothing to lose."""
    i, g = pl.program_id(0), g_ref[pl.program_id(0)]

    @pl.when(l_ref[i] == 1)
    def _():
        @pl.when(f_ref[i] == 1)
        def _():
            acc_ref[g] = jnp.zeros(acc_ref.shape[1:], acc_ref.dtype)

        acc_ref[g] += x_ref[...]
        o_ref[...] = acc_ref[g]


def combine(kernel, groups: np.ndarray, any_mode: bool = False, flags=None):
    first, last = _flags(groups) if flags is None else flags
    mode = ({"pipeline_mode": pl.Buffered(1, revisit=pl.RevisitMode.ANY)}
            if any_mode else {})

    def call(x):
        return pl.pallas_call(
            kernel,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=3, grid=(len(groups),),
                in_specs=[pl.BlockSpec((8, 128), lambda i, g, f, l: (i, 0))],
                out_specs=pl.BlockSpec((8, 128), lambda i, g, f, l: (g[i], 0),  # OUT-MAP
                                       **mode),
                scratch_shapes=[pltpu.VMEM((G, 8, 128), jnp.float32)]),
            out_shape=jax.ShapeDtypeStruct((G * 8, 128), jnp.float32),
        )(jnp.asarray(groups), jnp.asarray(first), jnp.asarray(last), x)

    return jax.jit(call)


def _x(groups: np.ndarray) -> jax.Array:
    return jnp.arange(len(groups) * 8 * 128, dtype=jnp.float32).reshape(-1, 128) / 7.0


def _sums(groups: np.ndarray, reduce=np.sum) -> np.ndarray:
    tiles = np.asarray(_x(groups)).reshape(len(groups), 8, 128)
    return np.concatenate([reduce(tiles[groups == g], axis=0) for g in range(G)])


def simulate(fn, *args, mode: DmaMode = DmaMode.ON_WAIT, **config):
    session = Session(Config(dma_mode=mode, races=True, **config))
    with session.install():
        value = jax.block_until_ready(fn(*args))
    assert session.engine_error is None, session.engine_error
    return np.asarray(value), session.findings


def _line(text: str) -> int:
    lines, first = inspect.getsourcelines(combine)
    return first + next(i for i, line in enumerate(lines) if text in line)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("kernel, any_mode, reduce", [
    (scratch_every_visit_kernel, False, np.sum),
    (scratch_last_visit_kernel, False, np.sum),
    (read_back_kernel, True, np.sum),
    (running_max_kernel, False, np.max),
], ids=["scratch-every-visit", "scratch-last-visit", "revisit-any", "running-max"])
def test_correct_revisits_are_clean(kernel, any_mode, reduce, mode):
    out, findings = simulate(combine(kernel, UNSORTED, any_mode), _x(UNSORTED), mode=mode)
    assert findings == []
    np.testing.assert_allclose(out, _sums(UNSORTED, reduce), rtol=1e-6)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_a_group_re_zeroed_at_its_revisit_loses_its_first_tile(mode):
    """Written whole at its last visit, and wrong: only data flow tells."""
    out, findings = simulate(combine(reinit_kernel, UNSORTED), _x(UNSORTED), mode=mode)
    tiles = np.asarray(_x(UNSORTED)).reshape(4, 8, 128)
    np.testing.assert_allclose(out, np.concatenate([tiles[2], tiles[3]]))  # tiles 0, 1 lost
    # Both groups lose their first tile; the session keeps one finding per defect (the
    # same line), the first: group 0's block, visited at (0,) and again at (2,).
    (f,) = findings
    assert f.kind.value == "output-revisited"
    assert f.buffer == "o_ref" and f.index_range == ((0, 8), (0, 128))
    assert f.details["block_index"] == [0, 0]
    assert f.grid_point == (2,)
    assert f.details["earlier_grid_point"] == [0] and f.details["last_grid_point"] == [2]
    assert f.details["decided_by"] == "perturbation"
    assert f.details["first_visit_inputs"] == [["x_ref", [0, 0]]]
    assert f.frames[0].line == _line("# OUT-MAP")
    assert "grid point (0,)" in f.message and "again at (2,)" in f.message
    assert "x_ref block (0, 0)" in f.message


def test_reading_back_without_revisit_any_reads_fresh_memory_and_says_so():
    out, findings = simulate(combine(read_back_kernel, UNSORTED), _x(UNSORTED))
    kinds = sorted(f.kind.value for f in findings)
    assert kinds == ["output-revisited", "uninitialized"], findings
    uninit = next(f for f in findings if f.kind.value == "uninitialized")
    assert uninit.buffer == "o_ref" and uninit.index_range == ((0, 8), (0, 128))
    assert uninit.frames[0].line == inspect.getsourcelines(read_back_kernel)[1] + 9
    assert "visited at grid point (0,) and again at (2,)" in uninit.message
    assert "starts from fresh memory" in uninit.message
    assert "RevisitMode.ANY" in uninit.message


def test_revisit_any_reads_the_block_back_as_a_dma():
    """The restoring read is a pipeline copy of its own, ordered after the earlier
    write-back (no race), and seen in the timeline as a copy-in of the output."""
    out, findings = simulate(combine(read_back_kernel, UNSORTED, any_mode=True),
                             _x(UNSORTED), mode=DmaMode.RANDOM, schedules=5)
    assert findings == []
    np.testing.assert_allclose(out, _sums(UNSORTED))


def reinit_with_carry_kernel(g_ref, f_ref, l_ref, x_ref, o_ref, acc_ref):
    """reinit_kernel plus half the previous tile, carried in scratch: perturbing group
    1's first tile changes what group 0's last visit adds, though nothing of group 0's
    own first tile reaches its block."""
    i = pl.program_id(0)

    @pl.when(jnp.logical_or(i == 0, g_ref[i] != g_ref[jnp.maximum(i - 1, 0)]))
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    @pl.when(i == 0)
    def _():
        acc_ref[0] = jnp.zeros(acc_ref.shape[1:], acc_ref.dtype)

    o_ref[...] += x_ref[...] + acc_ref[0]
    acc_ref[0] = x_ref[...] * 0.5


def test_one_revisits_perturbation_does_not_hide_anothers_loss(monkeypatch):
    """Both groups lose their first tile; perturbed together, each first visit changes
    the other group's block through the carry and both losses hid. Decided one block at
    a time (a re-run each per round), group 0's loss is reported."""
    runs = _count_runs(monkeypatch)
    out, findings = simulate(combine(reinit_with_carry_kernel, UNSORTED), _x(UNSORTED))
    tiles = np.asarray(_x(UNSORTED)).reshape(4, 8, 128)
    np.testing.assert_allclose(out, np.concatenate([tiles[2] + tiles[1] / 2,
                                                    tiles[3] + tiles[2] / 2]))
    (f,) = findings
    assert (f.kind.value, f.buffer, f.index_range, f.grid_point) == (
        "output-revisited", "o_ref", ((0, 8), (0, 128)), (2,))
    assert f.details["decided_by"] == "perturbation"
    assert len(runs) == 1 + 2 * 3  # each block: all three rounds, unchanged in each


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_a_first_visit_that_skips_its_tile_loses_nothing(mode):
    flags = (np.array([0, 1, 1, 0], np.int32), np.array([0, 1, 1, 1], np.int32))
    out, findings = simulate(combine(skip_padding_kernel, UNSORTED, flags=flags),
                             _x(UNSORTED), mode=mode)
    assert findings == []
    tiles = np.asarray(_x(UNSORTED)).reshape(4, 8, 128)
    np.testing.assert_allclose(out, np.concatenate([tiles[2], tiles[1] + tiles[3]]))


def _count_runs(monkeypatch) -> list[int]:
    runs = []
    real = explore.simulate_schedule

    def counted(*args, **kwargs):
        runs.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(explore, "simulate_schedule", counted)
    return runs


def test_no_rerun_without_a_non_consecutive_revisit(monkeypatch):
    """Sorted groups revisit nothing: the call is simulated once."""
    runs = _count_runs(monkeypatch)
    out, findings = simulate(combine(scratch_every_visit_kernel, SORTED), _x(SORTED))
    assert findings == [] and len(runs) == 1
    np.testing.assert_allclose(out, _sums(SORTED))


def test_a_revisit_costs_one_rerun_when_the_first_visit_reaches_the_result(monkeypatch):
    """Each revisited block (two here) is decided by re-runs of its own, so that one
    block's perturbation cannot hide another's loss: one re-run each when the first
    perturbation already changes the block."""
    runs = _count_runs(monkeypatch)
    simulate(combine(scratch_every_visit_kernel, UNSORTED), _x(UNSORTED))
    assert len(runs) == 1 + 2


def halves_from_scalars_kernel(s_ref, o_ref):
    """No input block to perturb: the writes decide (the first visit writes rows 0:4,
    the last visit only rows 4:8)."""
    i = pl.program_id(0)
    value = s_ref[i].astype(jnp.float32)

    @pl.when(i < 2)
    def _():
        o_ref[0:4, :] = jnp.full((4, 128), value, jnp.float32)

    @pl.when(i >= 2)
    def _():
        o_ref[4:8, :] = jnp.full((4, 128), value, jnp.float32)


def test_without_input_blocks_the_last_visits_writes_decide():
    def call(s):
        return pl.pallas_call(
            halves_from_scalars_kernel,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, grid=(4,), in_specs=[],
                out_specs=pl.BlockSpec((8, 128), lambda i, s: (i % 2, 0))),
            out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32))(s)

    _, findings = simulate(jax.jit(call), jnp.arange(4, dtype=jnp.int32))
    (lost,) = [f for f in findings if f.kind.value == "output-revisited"]
    assert lost.index_range == ((0, 4), (0, 128)) and lost.grid_point == (2,)
    assert lost.details["earlier_grid_point"] == [0]
    assert lost.details["decided_by"] == "writes"


@pytest.mark.parametrize("args", ["--dma random --schedules 20 --races", "--dma eager --races"],
                         ids=["random-20", "eager"])
@pytest.mark.parametrize("name", ["revisit_any_ok.py", "group_combine_ok.py",
                                  "output_revisited_ok.py"])
def test_revisit_samples_stay_clean_in_every_dma_mode(cli, sample, name, args):
    result = cli("run", *args.split(), sample(name))
    assert result.exit_code == 0 and result.findings == [], result.findings
    assert "output matches" in result.output


def test_revisit_any_does_not_excuse_a_block_the_kernel_re_zeroes():
    """The pipeline reads the block back, and the kernel zeroes it all the same."""
    fn = combine(reinit_kernel, UNSORTED, any_mode=True)
    out, findings = simulate(fn, _x(UNSORTED))
    (f,) = findings
    assert f.kind.value == "output-revisited" and f.details["decided_by"] == "perturbation"
    assert f.grid_point == (2,) and f.details["earlier_grid_point"] == [0]
    assert "read the block back (RevisitMode.ANY)" in f.message
