"""engine/call/unraced.py: which kernel refs may be written, or touched by another actor
than their core, read off the kernel jaxpr (a read through every use, a DMA's source, a
store through control flow), and which buffers a call with races on leaves out."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_check.checkers.races import RaceChecker
from pallas_check.config import Config, Tier
from pallas_check.engine.call import unraced


def _kernel(table_ref, x_hbm, o_ref, own_ref, landed_ref, sem):
    """table: read; x_hbm: a DMA's source; own: the core's own (stored, loaded, in a
    branch); landed: a DMA's destination; o: stored."""
    own_ref[...] = jnp.zeros((8, 128), jnp.float32)

    @pl.when(table_ref[0] > 0)
    def _():
        own_ref[...] += 1.0

    copy = pltpu.make_async_copy(x_hbm, landed_ref, sem)
    copy.start()
    copy.wait()
    o_ref[...] = own_ref[...] + landed_ref[...] + table_ref[1]


def _call():
    return pl.pallas_call(
        _kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(1,),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((8, 128), lambda i, t: (0, 0)),
            scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32),
                            pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA]))


def _kernel_jaxpr():
    table, x = jnp.array([1, 2], jnp.int32), jnp.ones((8, 128), jnp.float32)
    [eqn] = [e for e in jax.make_jaxpr(_call())(table, x).eqns
             if e.primitive.name == "pallas_call"]
    return eqn.params["jaxpr"], (table, x)


def test_what_each_kernel_ref_may_be():
    jaxpr, _ = _kernel_jaxpr()
    table, x_hbm, o_ref, own, landed, sem = jaxpr.invars
    written = unraced.escaping(jaxpr)
    shared = unraced.escaping(jaxpr, own=True)
    assert table not in written and x_hbm not in written  # loads; a DMA's source
    assert {o_ref, own, landed, sem} <= written
    assert table not in shared and own not in shared and o_ref not in shared
    assert x_hbm in shared and landed in shared  # a DMA touches them


def test_a_call_leaves_out_the_buffers_no_race_can_involve(check, monkeypatch):
    """With races on: the table, x (read by the DMA), own and o's VMEM block are left
    out of the race checker's feed; the DMA's landing, the core's read of it and the
    pipeline's write-back of o to HBM (an output) are not."""
    seen: list[tuple[str, str]] = []
    on_access = RaceChecker.on_access

    def recording(self, event):
        seen.append((event.buffer, event.operation))
        return on_access(self, event)

    monkeypatch.setattr(RaceChecker, "on_access", recording)
    _, (table, x) = _kernel_jaxpr()
    r = check(_call(), table, x, config=Config(races=True, tier=Tier.ENGINE))
    assert r.findings == []
    assert sorted(set(seen)) == [("landed_ref", "DMA write"), ("landed_ref", "read"),
                                 ("o_ref", "DMA write")]


def test_a_left_out_dma_read_that_signals_nothing_makes_no_event_for_the_race_checker(
        check, monkeypatch):
    """The DMA's read of x (nothing writes x, and a local DMA has no send semaphore) is
    nothing to the race checker (`takes_empty_dma_reads` False): only the landing is
    handed to it. A listener that takes such reads (the default) gets the read too, with
    no access and no semaphore."""
    _, (table, x) = _kernel_jaxpr()
    moved: list[tuple[bool, int, bool]] = []
    on_dma_moved = RaceChecker.on_dma_moved

    def recording(self, event):
        moved.append((event.landed, len(event.accesses), event.signalled is not None))
        return on_dma_moved(self, event)

    monkeypatch.setattr(RaceChecker, "on_dma_moved", recording)
    for takes in (False, True):
        moved.clear()
        monkeypatch.setattr(RaceChecker, "takes_empty_dma_reads", takes)
        r = check(_call(), table, x, config=Config(races=True, tier=Tier.ENGINE))
        assert r.findings == []
        assert moved == ([(False, 0, False)] if takes else []) + [(True, 1, True)]
