"""A call keeps its DMAs only while they matter: in flight, or landed and not yet waited in
full. One done with is let go at once, so that a long grid of manual DMAs costs the memory
of what is in flight, not of how many steps ran (issue 36, item 9: about 1 KB per DMA was
kept to the call's end); so is a DMA's scheduler actor in `random` mode.

The kernel counts the live `Dma` and `Actor` objects itself, from a debug callback between
a DMA's start and its wait, at several grid steps of a long call, under every DMA mode."""

from __future__ import annotations

import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_check.config import Config, DmaMode
from pallas_check.engine.dma.engine import Dma
from pallas_check.engine.runtime.scheduler import Actor
from pallas_check.intercept.session import Session

STEPS = 300
COUNTED_AT = (10, 150, STEPS - 1)


COUNTS: dict[int, tuple[int, int]] = {}  # grid step -> live DMAs, scheduler actors then


def _count(i: jax.Array) -> None:
    live = gc.get_objects()
    COUNTS[int(i)] = (sum(1 for o in live if type(o) is Dma),
                      sum(1 for o in live if type(o) is Actor))


def _call(x: jax.Array) -> jax.Array:
    def kernel(x_hbm, o_ref, buf, sems):
        i = pl.program_id(0)

        @pl.when(i == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        slot = i % 2
        copy = pltpu.make_async_copy(x_hbm.at[pl.ds(slot * 8, 8)], buf.at[slot],
                                     sems.at[slot])
        copy.start()
        for step in COUNTED_AT:
            pl.when(i == step)(lambda: jax.debug.callback(_count, i))
        copy.wait()
        o_ref[...] += buf[slot]

    return pl.pallas_call(
        kernel,
        grid=(STEPS,),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        scratch_shapes=[pltpu.VMEM((2, 8, 128), jnp.float32),
                        pltpu.SemaphoreType.DMA((2,))],
    )(x)


@pytest.mark.parametrize("mode", list(DmaMode), ids=lambda m: m.value)
def test_a_long_grid_keeps_only_its_dmas_in_flight(mode):
    x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
    COUNTS.clear()
    session = Session(Config(dma_mode=mode))
    with session.install():
        out = np.asarray(jax.block_until_ready(_call(x)))
    assert session.findings == [] and session.engine_error is None
    half = STEPS // 2
    expected = half * np.asarray(x[:8]) + half * np.asarray(x[8:])
    np.testing.assert_array_equal(out, expected)
    # Started and not yet waited at the callback: the step's own DMA (and perhaps the one
    # before it, in `random` mode), never the hundreds done with before it; the actors
    # are the core and (`random` mode) the DMAs in flight.
    assert sorted(COUNTS) == sorted(COUNTED_AT)
    assert all(1 <= dmas <= 2 and 1 <= actors <= 3 for dmas, actors in COUNTS.values()), \
        COUNTS
