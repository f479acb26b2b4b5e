"""The compiled tier through the session: which calls it runs, what stands of its run, and
that a call it hands back is reported by the engine exactly as `--tier engine` reports it."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_check.config import Config, DmaMode, Tier
from pallas_check.intercept import tiers
from pallas_check.intercept.session import Session


def _dma_loop(x_hbm, o_ref, buf, sem, *, steps: int, last: int):
    """Sums x's slabs one DMA at a time, then adds slab `last` once more."""

    def add_slab(i, total):
        pltpu.async_copy(x_hbm.at[i], buf, sem).wait()
        return total + buf[...]

    o_ref[...] = jax.lax.fori_loop(0, steps, add_slab, jnp.zeros(o_ref.shape, o_ref.dtype))
    # `last` past the end of x: the DMA's source box leaves the array.
    pltpu.sync_copy(x_hbm.at[last], buf)
    o_ref[...] += buf[...]


def dma_call(steps: int, last: int):
    return pl.pallas_call(
        functools.partial(_dma_loop, steps=steps, last=last),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA])


def _blocked_add(x_ref, y_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(1) == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += x_ref[...] * y_ref[...]
    o_ref[...] = acc_ref[...]


def reduce_call(rows: int, k: int):
    spec = pl.BlockSpec((8, 128), lambda i, j: (i, j))
    return pl.pallas_call(
        _blocked_add, grid=(rows // 8, k),
        in_specs=[spec, spec], out_specs=pl.BlockSpec((8, 128), lambda i, j: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((rows, 128), jnp.float32),
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32)])


def checked(fn, *args, **config):
    session = Session(Config(**config))
    with session.install():
        value = jax.block_until_ready(fn(*args))
    return np.asarray(value), session


def findings(session: Session) -> list[tuple]:
    return sorted((f.kind.value, f.buffer, str(f.index_range),
                   tuple((s.file, s.line) for s in f.frames)) for f in session.findings)


@pytest.mark.parametrize("mode", [DmaMode.ON_WAIT, DmaMode.EAGER])
def test_a_clean_dma_loop_runs_compiled_with_the_engines_outputs(mode):
    x = jax.random.normal(jax.random.key(0), (16, 8, 128), jnp.float32)
    call = dma_call(16, 3)
    got, compiled = checked(call, x, tier=Tier.COMPILED, races=True, dma_mode=mode)
    want, engine = checked(call, x, tier=Tier.ENGINE, races=True, dma_mode=mode)
    assert [c.tier for c in compiled.calls] == ["compiled"]
    assert [(c.tier, c.tier_reason) for c in engine.calls] == [("engine", "--tier engine")]
    assert compiled.findings == [] and engine.findings == []
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, np.asarray(x).sum(0) + np.asarray(x)[3], rtol=1e-5)


def test_a_buggy_call_is_reported_by_the_engine_as_under_tier_engine():
    """The source box of the last DMA leaves the array: the compiled run sets its
    out-of-bounds bit, and the engine reports the call, finding for finding."""
    x = jnp.ones((4, 8, 128), jnp.float32)
    call = dma_call(4, 4)
    _, compiled = checked(call, x, tier=Tier.COMPILED)
    _, engine = checked(call, x, tier=Tier.ENGINE)
    assert [c.tier for c in compiled.calls] == ["engine"]
    assert compiled.calls[0].tier_reason == "the compiled run saw out-of-bounds"
    assert findings(compiled) == findings(engine)
    assert [k for k, *_ in findings(engine)] == ["out-of-bounds"]


def test_grid_pipeline_and_scratch_compiled():
    x = jax.random.normal(jax.random.key(1), (32, 512), jnp.float32)
    y = jax.random.normal(jax.random.key(2), (32, 512), jnp.float32)
    call = reduce_call(32, 4)
    got, session = checked(call, x, y, tier=Tier.COMPILED, races=True)
    assert [c.tier for c in session.calls] == ["compiled"] and session.findings == []
    want = (np.asarray(x) * np.asarray(y)).reshape(32, 4, 128).sum(1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_an_output_block_revisited_goes_to_the_engine():
    """k outer, rows inner: each output block is visited once per k, after the others."""
    spec = pl.BlockSpec((8, 128), lambda j, i: (i, j))
    call = pl.pallas_call(
        _blocked_add, grid=(4, 4), in_specs=[spec, spec],
        out_specs=pl.BlockSpec((8, 128), lambda j, i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((32, 128), jnp.float32),
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32)])
    x = jnp.ones((32, 512), jnp.float32)
    _, compiled = checked(call, x, x, tier=Tier.COMPILED)
    _, engine = checked(call, x, x, tier=Tier.ENGINE)
    assert "revisit" in compiled.calls[0].tier_reason
    assert compiled.calls[0].tier == "engine"
    assert findings(compiled) == findings(engine) != []


def test_auto_compiles_a_structure_once_the_engine_has_spent_a_compile_on_it(monkeypatch):
    x = jnp.ones((32, 512), jnp.float32)
    call = jax.jit(reduce_call(32, 4))
    session = Session(Config(tier=Tier.AUTO))
    monkeypatch.setattr(tiers, "compile_seconds", lambda call: float("inf"))
    with session.install():
        for _ in range(3):
            jax.block_until_ready(call(x, x))
        assert [c.tier for c in session.calls] == ["engine"] * 3
        assert session.calls[0].tier_reason.startswith("not compiled yet")
        monkeypatch.setattr(tiers, "compile_seconds", lambda call: 0.0)
        jax.block_until_ready(call(x, x))  # its build starts: this call is the engine's
        session.tiers.settle()
        jax.block_until_ready(call(x, x))
    assert [c.tier for c in session.calls] == ["engine"] * 4 + ["compiled"]
    assert "in the background" in session.calls[3].tier_reason


def test_tier_compiled_refuses_an_ineligible_call_in_one_line():
    call = pl.pallas_call(
        lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] + 1),
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32), input_output_aliases={0: 0})
    session = Session(Config(tier=Tier.COMPILED))
    with pytest.raises(Exception):
        with session.install():
            jax.block_until_ready(call(jnp.ones((8, 128), jnp.float32)))
    assert session.error_code == 2
    assert session.engine_error is not None
    assert session.engine_error.endswith("cannot run compiled: input_output_aliases")
    assert "\n" not in session.engine_error


def _mxu_kernel(x_ref, w_ref, o_ref):
    pltpu.matmul_push_rhs(w_ref[...], staging_register=0, mxu_index=0)
    pltpu.matmul_acc_lhs(0, x_ref[...], mxu_index=0, load_staged_rhs=0)
    o_ref[...] = pltpu.matmul_pop(0, (8, 256), jnp.float32, 0)


def test_explicit_mxu_operations_are_the_engines(monkeypatch):
    """The MXUs' state is the engine's (engine/rules/mxu.py): `--tier compiled` refuses
    the call in one line, and `auto` builds nothing for it, the engine running every call
    with the tracer's reason."""
    call = jax.jit(pl.pallas_call(_mxu_kernel,
                                  out_shape=jax.ShapeDtypeStruct((8, 256), jnp.float32)))
    x, w = jnp.ones((8, 256), jnp.float32), jnp.ones((256, 256), jnp.float32)
    reason = "an explicit MXU operation (`matmul_push_rhs`)"
    session = Session(Config(tier=Tier.COMPILED, tpu="v7x"))
    with pytest.raises(Exception):
        with session.install():
            jax.block_until_ready(call(x, w))
    assert session.error_code == 2
    assert session.engine_error is not None
    assert session.engine_error.endswith(f"cannot run compiled: {reason}")
    session = Session(Config(tier=Tier.AUTO, tpu="v7x"))
    monkeypatch.setattr(tiers, "compile_seconds", lambda call: 0.0)
    with session.install():
        jax.block_until_ready(call(x, w))  # its build starts
        session.tiers.settle()
        got = jax.block_until_ready(call(x, w))
    assert [(c.tier, c.tier_reason) for c in session.calls][-1] == ("engine", reason)
    assert session.findings == []
    np.testing.assert_array_equal(np.asarray(got), np.full((8, 256), 256.0, np.float32))


def _short_wait(x_hbm, o_ref, buf, sem):
    """The first wait takes half of what its DMA signals: the second DMA's wait is met by
    what is left, before that DMA lands (on_wait: it never lands, nothing waits for it)."""
    pltpu.async_copy(x_hbm.at[0:2], buf, sem)
    pltpu.make_async_copy(x_hbm.at[0], buf.at[0], sem).wait()
    pltpu.async_copy(x_hbm.at[2], buf.at[1], sem).wait()
    o_ref[...] = buf[0] + buf[1]


def test_a_wait_met_before_its_dma_lands_goes_to_the_engine():
    """The paired wait (a DMA started and waited in one stretch of code) lands its DMA
    without searching the table; where the count already covers the wait, the DMA that
    would land is the engine's to decide: COUNT_AHEAD, and the engine reports the call."""
    call = pl.pallas_call(
        _short_wait, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        scratch_shapes=[pltpu.VMEM((2, 8, 128), jnp.float32), pltpu.SemaphoreType.DMA])
    x = jax.random.normal(jax.random.key(3), (3, 8, 128), jnp.float32)
    _, compiled = checked(call, x, tier=Tier.COMPILED, races=True)
    _, engine = checked(call, x, tier=Tier.ENGINE, races=True)
    reason = compiled.calls[0].tier_reason
    assert reason.startswith("the compiled run saw") and "count-ahead" in reason, reason
    assert findings(compiled) == findings(engine)
    assert "dma-not-waited" in [k for k, *_ in findings(engine)]


def _one_wait_too_many(x_hbm, o_ref, buf, sem):
    """Two slabs' DMAs on one semaphore, one wait for both, then a wait for the second
    again: nothing is left to meet it (one core: the engine reports a deadlock)."""
    first = pltpu.make_async_copy(x_hbm.at[0], buf.at[0], sem)
    second = pltpu.make_async_copy(x_hbm.at[1], buf.at[1], sem)
    first.start()
    second.start()
    pltpu.make_async_copy(x_hbm.at[0:2], buf, sem).wait()
    second.wait()
    o_ref[...] = buf[0] + buf[1]


@pytest.mark.parametrize("mode", [DmaMode.ON_WAIT, DmaMode.EAGER])
def test_a_wait_after_a_wider_wait_took_its_dma_goes_to_the_engine(mode):
    """The wider wait searches the table and retires both DMAs; the DMA the second wait
    names is gone, so that wait cannot be met: the compiled run must not take the DMA
    again as its own (the trace forgets what a searching wait may have taken)."""
    call = pl.pallas_call(
        _one_wait_too_many, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        scratch_shapes=[pltpu.VMEM((2, 8, 128), jnp.float32), pltpu.SemaphoreType.DMA])
    x = jax.random.normal(jax.random.key(4), (2, 8, 128), jnp.float32)
    _, compiled = checked(call, x, tier=Tier.COMPILED, dma_mode=mode)
    _, engine = checked(call, x, tier=Tier.ENGINE, dma_mode=mode)
    assert compiled.calls[0].tier == "engine", compiled.calls[0].tier_reason
    assert "wait-unmet" in compiled.calls[0].tier_reason
    assert findings(compiled) == findings(engine)
    assert "deadlock" in [k for k, *_ in findings(engine)]


def test_race_coverage_is_counted_once_per_loop_as_on_each_trip():
    """What race checking covered, counted at trace time and multiplied by a loop's trips:
    3 checked accesses a trip of the DMA loop (its start's read and write, the read of
    buf) plus 8 after it; the blocked reduction's count is the engine's own."""
    for steps in (4, 16):
        x = jnp.ones((steps, 8, 128), jnp.float32)
        _, session = checked(dma_call(steps, 1), x, tier=Tier.COMPILED, races=True)
        assert [(c.tier, c.races) for c in session.calls] == [
            ("compiled", {"accesses_checked": 3 * steps + 8, "longest_history": 1})]
    x = jax.random.normal(jax.random.key(5), (32, 512), jnp.float32)
    _, compiled = checked(reduce_call(32, 4), x, x, tier=Tier.COMPILED, races=True)
    _, engine = checked(reduce_call(32, 4), x, x, tier=Tier.ENGINE, races=True)
    assert compiled.calls[0].tier == "compiled"
    assert (compiled.calls[0].races["accesses_checked"]
            == engine.calls[0].races["accesses_checked"] > 0)


def _prefetching_loop(x_hbm, o_ref, buf, sem, *, racy: bool):
    """Trip i adds slab i and starts slab i+1's DMA, which the next trip waits for: a DMA
    in flight across the loop's trips (its row is in the table when the next trip
    starts; before the loop the table is empty). `racy` reads buf before that wait."""
    steps = x_hbm.shape[0]
    pltpu.sync_copy(x_hbm.at[0], buf)

    def trip(i, total):
        if racy:
            total = total + buf[...]

        @pl.when(i > 0)
        def _():
            pltpu.make_async_copy(x_hbm.at[i], buf, sem).wait()

        if not racy:
            total = total + buf[...]

        @pl.when(i + 1 < steps)
        def _():
            pltpu.make_async_copy(x_hbm.at[i + 1], buf, sem).start()

        return total

    o_ref[...] = jax.lax.fori_loop(0, steps, trip, jnp.zeros(o_ref.shape, o_ref.dtype))


@pytest.mark.parametrize("racy", [False, True])
def test_a_dma_in_flight_across_loop_trips_is_race_checked(racy):
    """The loop's body is traced first as the table is before the loop (empty); it leaves
    a row, so it is traced again knowing the table may hold one: the racy read at the
    trip's start is checked against the DMA the previous trip started (the engine then
    reports the race), and the clean loop stands compiled."""
    call = pl.pallas_call(
        functools.partial(_prefetching_loop, racy=racy),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA])
    x = jax.random.normal(jax.random.key(6), (6, 8, 128), jnp.float32)
    got, compiled = checked(call, x, tier=Tier.COMPILED, races=True)
    want, engine = checked(call, x, tier=Tier.ENGINE, races=True)
    assert findings(compiled) == findings(engine)
    if not racy:
        assert [c.tier for c in compiled.calls] == ["compiled"] and engine.findings == []
        np.testing.assert_array_equal(got, want)
        np.testing.assert_allclose(got, np.asarray(x).sum(0), rtol=1e-5)
        return
    assert compiled.calls[0].tier == "engine"
    assert "race" in compiled.calls[0].tier_reason, compiled.calls[0].tier_reason
    assert "race" in [k for k, *_ in findings(engine)]


def _halves(x_ref, o_ref, acc_ref, *, skip_second: bool, whole_output: bool):
    """The scratch written in two halves, then read whole; the output written whole or
    in two halves. Scratch and output blocks keep one bool for their shadow until a
    pass sees part of them accessed (compiled/state.py, `written_in`)."""
    acc_ref[0:4, :] = x_ref[0:4, :] * 2.0
    if not skip_second:
        acc_ref[4:8, :] = x_ref[4:8, :] + 1.0
    if whole_output:
        o_ref[...] = acc_ref[...]
    else:
        o_ref[0:4, :] = acc_ref[0:4, :]
        o_ref[4:8, :] = acc_ref[4:8, :]


def halves_call(skip_second: bool, whole_output: bool):
    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    return pl.pallas_call(
        functools.partial(_halves, skip_second=skip_second, whole_output=whole_output),
        grid=(3,), in_specs=[spec], out_specs=spec,
        out_shape=jax.ShapeDtypeStruct((24, 128), jnp.float32),
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32)])


@pytest.mark.parametrize("whole_output", [True, False])
def test_a_buffer_written_in_parts_and_read_whole_stays_compiled(whole_output):
    x = jax.random.normal(jax.random.key(5), (24, 128), jnp.float32)
    got, session = checked(halves_call(False, whole_output), x, tier=Tier.COMPILED)
    assert [c.tier for c in session.calls] == ["compiled"] and session.findings == []
    want = np.asarray(x).reshape(3, 8, 128).copy()
    want[:, :4] *= 2.0
    want[:, 4:] += 1.0
    np.testing.assert_array_equal(got, want.reshape(24, 128))


def test_a_read_of_a_half_never_written_is_reported_as_under_tier_engine():
    x = jnp.ones((24, 128), jnp.float32)
    call = halves_call(True, True)
    _, compiled = checked(call, x, tier=Tier.COMPILED)
    _, engine = checked(call, x, tier=Tier.ENGINE)
    assert compiled.calls[0].tier == "engine"
    assert compiled.calls[0].tier_reason.startswith("the compiled run saw uninitialized")
    assert findings(compiled) == findings(engine)
    # The rows never written, read at `o_ref[...] = acc_ref[...]`.
    assert [(k, b, r) for k, b, r, _ in findings(engine)] == [
        ("uninitialized", "acc_ref", "((4, 8), (0, 128))")]


def _halves_waited(flag_ref, x_hbm, o_ref, buf, sem, *, dmas: int):
    """`dmas` DMAs of two slabs each on one semaphore, started in a branch (so they are
    in the DMA table when waited), then waited one slab's bytes at a time."""
    @pl.when(flag_ref[0] > 0)
    def _():
        for k in range(dmas):
            pltpu.make_async_copy(x_hbm.at[2 * k:2 * k + 2], buf.at[2 * k:2 * k + 2],
                                  sem).start()

    for k in range(2 * dmas):
        pltpu.make_async_copy(x_hbm.at[0], buf.at[0], sem).wait()
    o_ref[...] = jnp.sum(buf[...], axis=0)


def halves_waited_call(dmas: int):
    return pl.pallas_call(
        functools.partial(_halves_waited, dmas=dmas),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        scratch_shapes=[pltpu.VMEM((2 * dmas, 8, 128), jnp.float32),
                        pltpu.SemaphoreType.DMA])


@pytest.mark.parametrize("mode", [DmaMode.ON_WAIT, DmaMode.EAGER])
def test_waits_of_part_of_a_dma_in_the_table(mode):
    """A wait that one DMA covers lands and retires the newest DMA on its cell with one
    search of the table. One DMA waited in two halves: the first half lands and retires
    it, the second finds the count left: it stays compiled. Two DMAs so waited: the
    second wait finds its count met while the older DMA is still pending, which only
    the engine's search says what to do with (COUNT_AHEAD, on_wait): the engine runs it,
    and it is clean there too."""
    flag = jnp.ones((1,), jnp.int32)
    for dmas, stands in ((1, True), (2, mode is DmaMode.EAGER)):
        x = jax.random.normal(jax.random.key(dmas), (2 * dmas, 8, 128), jnp.float32)
        call = halves_waited_call(dmas)
        got, compiled = checked(call, flag, x, tier=Tier.COMPILED, dma_mode=mode, races=True)
        want, engine = checked(call, flag, x, tier=Tier.ENGINE, dma_mode=mode, races=True)
        assert compiled.findings == engine.findings == []
        np.testing.assert_array_equal(got, want)
        np.testing.assert_allclose(got, np.asarray(x).sum(0), rtol=1e-6)
        call_run = compiled.calls[0]
        if stands:
            assert call_run.tier == "compiled", call_run.tier_reason
        else:
            assert call_run.tier == "engine"
            assert call_run.tier_reason == "the compiled run saw count-ahead"


def _swap_old(x_ref, o_ref):
    """The old value of the output block, as a swap returns it: never written in this
    visit, so the never-written fill (NaN by default) at every grid step."""
    old = o_ref.swap(x_ref[...])
    o_ref[...] = x_ref[...] + jnp.where(jnp.isnan(old), 1.0, 2.0)


def test_an_output_block_read_by_a_swap_is_refilled_when_it_moves():
    """A moved output block is refilled with the never-written fill only where the
    kernel uses a swap's old value (any other read of it is checked); here it does."""
    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    call = pl.pallas_call(_swap_old, grid=(3,), in_specs=[spec], out_specs=spec,
                          out_shape=jax.ShapeDtypeStruct((24, 128), jnp.float32))
    x = jax.random.normal(jax.random.key(6), (24, 128), jnp.float32)
    got, compiled = checked(call, x, tier=Tier.COMPILED)
    want, engine = checked(call, x, tier=Tier.ENGINE)
    assert [c.tier for c in compiled.calls] == ["compiled"]
    assert findings(compiled) == findings(engine)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, np.asarray(x) + 1.0)


def _slices_in_flight(x_hbm, dst_ref, o_ref, side, acc, sem, side_sem, *, racy: bool):
    """Trip i starts the DMA of slab i into slab i of `dst_ref` (an input block, whose
    written-shadow is per element from the start); all are waited after the loop. A DMA
    on another semaphore is in flight across the loop, so the loop's body is traced once,
    knowing the table may hold a row. `racy` reads slab i-1 while the DMA the previous
    trip started into it is in flight: that read is traced before the trace meets any
    DMA into `dst_ref`. The clean loop reads and writes `acc`, which no DMA moves (its
    accesses are compared with nothing)."""
    steps = x_hbm.shape[0]
    side_copy = pltpu.make_async_copy(x_hbm.at[0], side, side_sem)
    side_copy.start()
    acc[...] = jnp.zeros_like(acc)

    def trip(i, total):
        if racy:
            total = total + dst_ref[jnp.maximum(i - 1, 0)]
        else:
            acc[...] += 1.0
        pltpu.make_async_copy(x_hbm.at[i], dst_ref.at[i], sem).start()
        return total

    total = jax.lax.fori_loop(0, steps, trip, jnp.zeros(o_ref.shape, o_ref.dtype))
    for i in range(steps):
        pltpu.make_async_copy(x_hbm.at[i], dst_ref.at[i], sem).wait()
    side_copy.wait()
    o_ref[...] = total + jnp.sum(dst_ref[...], axis=0) + acc[...] + side[...]


@pytest.mark.parametrize("racy", [False, True])
def test_an_access_traced_before_the_first_dma_into_its_buffer_is_race_checked(racy):
    """An access is compared with the DMA table only where some DMA site the trace knows
    moves its buffer; a site met later that does makes the trace stale, and the call is
    traced again knowing it (here nothing else would trace it again): the racy read is
    then checked (the engine reports the race) and the clean loop, whose accesses no DMA
    can meet, stands compiled."""
    steps = 4
    call = pl.pallas_call(
        functools.partial(_slices_in_flight, racy=racy),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pltpu.VMEM)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.VMEM((8, 128), jnp.float32),
                        pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA])
    x = jax.random.normal(jax.random.key(7), (steps, 8, 128), jnp.float32)
    zeros = jnp.zeros_like(x)
    got, compiled = checked(call, x, zeros, tier=Tier.COMPILED, races=True)
    want, engine = checked(call, x, zeros, tier=Tier.ENGINE, races=True)
    assert findings(compiled) == findings(engine)
    if not racy:
        assert [c.tier for c in compiled.calls] == ["compiled"] and engine.findings == []
        np.testing.assert_array_equal(got, want)
        np.testing.assert_allclose(got, np.asarray(x).sum(0) + steps + np.asarray(x)[0],
                                   rtol=1e-5)
        return
    assert compiled.calls[0].tier == "engine"
    assert "race" in compiled.calls[0].tier_reason, compiled.calls[0].tier_reason
    assert [k for k, *_ in findings(engine)] == ["race"]


def _loop_then_write_back(x_hbm, o_hbm, buf, out_buf, sem):
    """A loop that waits on `sem`, then a DMA on a semaphore of its own (sync_copy's)
    into the output, which the loop does not carry: the loop's waits cannot land it."""
    def trip(i, total):
        pltpu.make_async_copy(x_hbm.at[i], buf, sem).start()
        pltpu.make_async_copy(x_hbm.at[i], buf, sem).wait()
        return total + buf[...]

    out_buf[...] = jax.lax.fori_loop(0, x_hbm.shape[0], trip, jnp.zeros(buf.shape, buf.dtype))
    pltpu.sync_copy(out_buf, o_hbm)


@pytest.mark.parametrize("kernel", ["slices", "reduce", "dma", "halves", "write_back"])
def test_a_call_is_traced_once_where_nothing_calls_for_another_pass(kernel, monkeypatch):
    """A store whose old value nothing reads (`ref[...] += x` in a loop or branch body
    keeps that value as a named variable) does not read it, so no second tracing pass
    refills output blocks; a grid of one step is straight-line code, traced once though
    it leaves DMA rows in the table; a loop whose waits may land DMAs carries the buffers
    its own DMA starts write, so a site met in its body changes nothing the trace took
    (the DMA loop), and a site met later matters to it only on a semaphore its waits are
    on (the write-back); a scratch buffer that an access covers in part keeps a shadow
    per element from the first pass, found in the jaxpr before tracing (the halves).
    Each grid step traced is one grid point made."""
    from pallas_check.compiled import program

    made = []
    grid_point = program._grid_point
    monkeypatch.setattr(program, "_grid_point",
                        lambda flat, grid: made.append(grid) or grid_point(flat, grid))
    if kernel == "slices":
        steps = 4
        call = pl.pallas_call(
            functools.partial(_slices_in_flight, racy=False),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY),
                      pl.BlockSpec(memory_space=pltpu.VMEM)],
            out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
            out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
            scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32),
                            pltpu.VMEM((8, 128), jnp.float32),
                            pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA])
        x = jax.random.normal(jax.random.key(8), (steps, 8, 128), jnp.float32)
        args = (x, jnp.zeros_like(x))
    elif kernel == "reduce":
        call = reduce_call(32, 4)
        x = jax.random.normal(jax.random.key(9), (32, 512), jnp.float32)
        args = (x, x)
    elif kernel == "dma":
        call = dma_call(6, 2)
        args = (jax.random.normal(jax.random.key(10), (6, 8, 128), jnp.float32),)
    elif kernel == "halves":
        call = halves_call(skip_second=False, whole_output=False)
        args = (jax.random.normal(jax.random.key(11), (24, 128), jnp.float32),)
    else:
        call = pl.pallas_call(
            _loop_then_write_back,
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
            scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32),
                            pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA])
        args = (jax.random.normal(jax.random.key(12), (5, 8, 128), jnp.float32),)
    got, compiled = checked(call, *args, tier=Tier.COMPILED, races=True)
    assert [c.tier for c in compiled.calls] == ["compiled"]
    assert len(made) == 1, made
    want, _ = checked(call, *args, tier=Tier.ENGINE, races=True)
    np.testing.assert_array_equal(got, want)
