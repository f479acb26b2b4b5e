"""The BlockSpec pipeline runs as a TPU runs it (issue 10, item 1): block copies are DMAs of
their own, concurrent with the body they overlap. The copy-in of step i+1 starts before
body i; the write-back of step i is waited only after body i+1; `pl.Buffered(1)` makes
both synchronous. Each case is a kernel that is right or wrong on a TPU only because of
that overlap, checked in every DMA mode."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_check.config import Config, DmaMode
from pallas_check.intercept.session import Session

BLOCKS, ROWS = 4, 8
MODES = [DmaMode.ON_WAIT, DmaMode.EAGER, DmaMode.RANDOM]


def simulate(fn, *args, mode: DmaMode):
    session = Session(Config(dma_mode=mode, races=True))
    with session.install():
        value = jax.block_until_ready(fn(*args))
    assert session.engine_error is None, session.engine_error
    return np.asarray(value), session.findings


def _line(fn, text: str) -> int:
    import inspect

    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def read_previous_output(x):
    """Step i DMA-reads from HBM the output block step i-1 wrote (the output is aliased
    to an HBM input): that block's write-back is still in flight during body i."""

    def kernel(prev_hbm, o_ref, buf, sem):
        i = pl.program_id(0)

        @pl.when(i > 0)
        def _():
            copy = pltpu.make_async_copy(prev_hbm.at[pl.ds((i - 1) * ROWS, ROWS)], buf, sem)
            copy.start()  # READ-PREVIOUS
            copy.wait()

        @pl.when(i == 0)
        def _():
            buf[...] = jnp.zeros_like(buf)

        o_ref[...] = buf[...] + 1.0

    return pl.pallas_call(
        kernel, grid=(BLOCKS,),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((ROWS, 128), lambda i: (i, 0)),  # OUT-MAP
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM((ROWS, 128), jnp.float32), pltpu.SemaphoreType.DMA],
        input_output_aliases={0: 0},
    )(x)


def shift_forward(x, buffers: int | None = None):
    """Step i writes block i+1 of the aliased HBM array while the pipeline fetches it."""

    def kernel(x_ref, o_hbm, sem):
        i = pl.program_id(0)

        @pl.when(i + 1 < BLOCKS)
        def _():
            copy = pltpu.make_async_copy(x_ref, o_hbm.at[pl.ds((i + 1) * ROWS, ROWS)], sem)
            copy.start()
            copy.wait()

    mode = {} if buffers is None else {"pipeline_mode": pl.Buffered(buffers)}
    return pl.pallas_call(
        kernel, grid=(BLOCKS,),
        in_specs=[pl.BlockSpec((ROWS, 128), lambda i: (i, 0), **mode)],  # IN-MAP
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.SemaphoreType.DMA],
        input_output_aliases={0: 0},
    )(x)


def _x():
    return jnp.arange(BLOCKS * ROWS * 128, dtype=jnp.float32).reshape(BLOCKS * ROWS, 128)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_reading_a_block_whose_write_back_is_in_flight_is_a_race(mode):
    out, findings = simulate(jax.jit(read_previous_output), _x(), mode=mode)
    races = [f for f in findings if f.kind.value == "race"]
    assert races, findings
    race = races[0]
    assert race.buffer == "prev_hbm" and race.index_range == ((0, ROWS), (0, 128))
    labels = sorted(a.actor for a in race.accesses)
    assert "pipeline write-back of o_ref block (0, 0)" in labels
    by_actor = {a.actor: a for a in race.accesses}
    write_back = by_actor["pipeline write-back of o_ref block (0, 0)"]
    assert write_back.operation == "DMA write"
    assert write_back.frames[0].line == _line(read_previous_output, "# OUT-MAP")
    other = next(a for a in race.accesses if a is not write_back)
    assert other.operation == "DMA read"
    assert other.frames[0].line == _line(read_previous_output, "# READ-PREVIOUS")


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_writing_the_block_being_prefetched_is_a_race(mode):
    _, findings = simulate(jax.jit(shift_forward), _x(), mode=mode)
    races = [f for f in findings if f.kind.value == "race"]
    assert races, findings
    actors = {a.actor for a in races[0].accesses}
    assert "pipeline copy-in of x_ref block (1, 0)" in actors, actors
    copy_in = next(a for a in races[0].accesses if a.actor.startswith("pipeline"))
    assert copy_in.frames[0].line == _line(shift_forward, "# IN-MAP")
    assert copy_in.grid_point == (1,)  # the step the block is fetched for


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_single_buffering_fetches_after_the_body_so_nothing_races(mode):
    x = _x()
    out, findings = simulate(jax.jit(lambda x: shift_forward(x, buffers=1)), x, mode=mode)
    assert findings == []
    # Each step's fetch follows the previous body: block i+1 holds x's block 0 by then.
    np.testing.assert_array_equal(out, np.tile(np.asarray(x[:ROWS]), (BLOCKS, 1)))


def test_on_wait_fetches_late_and_eager_fetches_early():
    """The two deterministic modes are the two ends of the race: `eager` reads the next
    block when its fetch starts (before body i writes it), `on_wait` when it is waited
    (after), so their outputs differ; neither is "the" TPU answer."""
    x = _x()
    early, _ = simulate(jax.jit(shift_forward), x, mode=DmaMode.EAGER)
    late, _ = simulate(jax.jit(shift_forward), x, mode=DmaMode.ON_WAIT)
    blocks = np.asarray(x).reshape(BLOCKS, ROWS, 128)
    np.testing.assert_array_equal(early.reshape(BLOCKS, ROWS, 128)[1:], blocks[:-1])
    np.testing.assert_array_equal(late.reshape(BLOCKS, ROWS, 128), blocks[[0] * BLOCKS])


def test_an_unchanged_block_is_neither_fetched_nor_written_back():
    """An accumulator whose output block stays put over the reduction axis is written back
    once; an input block that does not change is fetched once (no copy, no race)."""

    def kernel(w_ref, x_ref, o_ref):
        @pl.when(pl.program_id(0) == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += x_ref[...] * w_ref[...]

    def run(w, x):
        return pl.pallas_call(
            kernel, grid=(BLOCKS,),
            in_specs=[pl.BlockSpec((ROWS, 128), lambda k: (0, 0)),
                      pl.BlockSpec((ROWS, 128), lambda k: (k, 0))],
            out_specs=pl.BlockSpec((ROWS, 128), lambda k: (0, 0)),
            out_shape=jax.ShapeDtypeStruct((ROWS, 128), jnp.float32))(w, x)

    w = jnp.full((ROWS, 128), 2.0, jnp.float32)
    x = _x()
    for mode in MODES:
        out, findings = simulate(jax.jit(run), w, x, mode=mode)
        assert findings == []
        np.testing.assert_array_equal(out, 2.0 * np.asarray(x).reshape(BLOCKS, ROWS, 128).sum(0))
