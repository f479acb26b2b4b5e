"""What a semaphore counts and whose it is: DMAs that signal a REGULAR semaphore (one count
per DMA, TPU v6+ in JAX's tests; the DMA's byte count / 32 on a v5e, measured on the chip;
none for a DMA of no bytes), `pl.select_ref` (a DMA's ref
chosen by a traced index), and `pl.semaphore_signal(..., core_index=i)` (another core's
semaphore). Expectations come from Mosaic's lowering and JAX's TPU tests, each checked
against a numpy reference."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_check.config import Config, DmaMode
from scenarios.test_samples import run_args

MODES = [DmaMode.ON_WAIT, DmaMode.EAGER, DmaMode.RANDOM]
X = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)


def _clean(result):
    assert result.session.engine_error is None, result.session.engine_error
    assert result.findings == [], [f.message for f in result.findings]
    return np.asarray(result.value)


def _hbm_call(kernel, out_shape, *scratch):
    """A one-step call with its input and output left in HBM for the kernel's DMAs."""
    def call(x):
        return pl.pallas_call(
            kernel, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY), scratch_shapes=list(scratch),
            out_shape=jax.ShapeDtypeStruct(out_shape, jnp.float32))(x)
    return call


# -- DMAs signalling a REGULAR semaphore ------------------------------------------------


def _jax_regular_dma_kernel(x_hbm_ref, y_hbm_ref):
    """JAX's test_dma_with_regular_semaphore: one `pl.semaphore_wait(sem)` per DMA."""
    def body(x_ref, y_ref, sem):
        pltpu.async_copy(x_hbm_ref, x_ref, sem)
        pl.semaphore_wait(sem)
        y_ref[...] = x_ref[...]
        pltpu.async_copy(y_ref, y_hbm_ref, sem)
        pl.semaphore_wait(sem)

    pl.run_scoped(body, pltpu.VMEM((16, 128), jnp.float32),
                  pltpu.VMEM((16, 128), jnp.float32), pltpu.SemaphoreType.REGULAR)


@pytest.mark.parametrize("tpu", ["v6e", "v7x"])
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_a_dma_adds_one_to_a_regular_semaphore(check, mode, tpu):
    """Before: the DMA added its 8192 bytes (on_wait: deadlock, as the wait did not land
    it; other modes: a semaphore left at 8190)."""
    config = Config(dma_mode=mode, races=True, schedules=5 if mode == DmaMode.RANDOM else 1,
                    tpu=tpu)
    out = _clean(check(_hbm_call(_jax_regular_dma_kernel, (16, 128)), X, config=config))
    np.testing.assert_array_equal(out, X)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_on_a_v5e_a_dma_adds_its_32_byte_count_to_a_regular_semaphore(check, mode):
    """The chip (hardware/README.md, probe semaphores.py): a DMA of 8192 bytes adds 256 to
    the regular semaphore it signals on a v5e. JAX's one-wait-per-DMA kernel leaves
    counts behind there (the chip halts the core at the kernel's exit); waiting the count
    is clean."""
    config = Config(dma_mode=mode, tpu="v5e", schedules=5 if mode == DmaMode.RANDOM else 1)
    found = check(_hbm_call(_jax_regular_dma_kernel, (16, 128)), X, config=config).findings
    nw = [f for f in found if f.kind.value == "dma-not-waited"]
    assert [(f.buffer, f.details["bytes"]) for f in nw] == [("x_ref", 8192), ("y_hbm_ref", 8192)]
    assert "added 256 to regular semaphore sem" in nw[0].message
    assert "pl.semaphore_wait(sem, 256)" in (nw[0].help or "")

    def counted(x_hbm_ref, y_hbm_ref):
        def body(x_ref, y_ref, sem):
            pltpu.async_copy(x_hbm_ref, x_ref, sem)
            pl.semaphore_wait(sem, 16 * 128 * 4 // 32)
            y_ref[...] = x_ref[...]
            pltpu.async_copy(y_ref, y_hbm_ref, sem)
            pl.semaphore_wait(sem, 16 * 128 * 4 // 32)
        pl.run_scoped(body, pltpu.VMEM((16, 128), jnp.float32),
                      pltpu.VMEM((16, 128), jnp.float32), pltpu.SemaphoreType.REGULAR)
    out = _clean(check(_hbm_call(counted, (16, 128)), X,
                       config=dataclasses.replace(config, races=True)))
    np.testing.assert_array_equal(out, X)


@pytest.mark.parametrize("tpu,rows,want", [("v5e", 8, 128), ("v5e", 3, 48), ("v5e", 0, 0),
                                           ("v6e", 8, 4096)])
def test_a_dma_semaphore_reads_as_the_chip_counts(check, tpu, rows, want):
    """`pl.semaphore_read` of a DMA semaphore once its DMA landed: the byte count / 32 on a
    v5e, as the chip read it (8 rows of float32: 128, 3 rows: 48, none: 0); bytes on v6e
    (not measured: unverified)."""
    def kernel(n_ref, x_hbm, o_ref, buf, sem):
        copy = pltpu.make_async_copy(x_hbm.at[pl.ds(0, n_ref[0])], buf.at[pl.ds(0, n_ref[0])],
                                     sem)
        copy.start()
        o_ref[0] = pl.semaphore_read(sem)

        @pl.when(n_ref[0] > 0)
        def _():
            copy.wait()
        o_ref[1] = pl.semaphore_read(sem)

    call = lambda n, x: pl.pallas_call(  # noqa: E731
        kernel, grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(1,), in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pltpu.SMEM),
            scratch_shapes=[pltpu.VMEM((16, 128), jnp.float32), pltpu.SemaphoreType.DMA]),
        out_shape=jax.ShapeDtypeStruct((2,), jnp.int32))(n, x)
    out = _clean(check(call, jnp.array([rows], jnp.int32), X,
                       config=Config(dma_mode=DmaMode.EAGER, tpu=tpu)))
    assert out.tolist() == [want, 0]


def test_a_regular_semaphore_wait_of_two_lands_two_dmas(check):
    def kernel(x_hbm, o_hbm, buf, sem):
        pltpu.async_copy(x_hbm.at[pl.ds(0, 8)], buf.at[pl.ds(8, 8)], sem)
        pltpu.async_copy(x_hbm.at[pl.ds(8, 8)], buf.at[pl.ds(0, 8)], sem)
        pl.semaphore_wait(sem, 2)
        buf[...] = buf[...] + 1.0
        pltpu.sync_copy(buf, o_hbm)

    call = _hbm_call(kernel, (16, 128), pltpu.VMEM((16, 128), jnp.float32),
                     pltpu.SemaphoreType.REGULAR)
    out = _clean(check(call, X, config=Config(races=True, tpu="v6e")))
    np.testing.assert_array_equal(out, np.concatenate([X[8:], X[:8]]) + 1.0)


def test_a_regular_semaphore_dma_never_waited_is_dma_not_waited(check):
    """Two DMAs, one wait of 1: the second DMA's count is never taken (one finding naming
    it, not a semaphore leak as well)."""
    def kernel(x_hbm, o_hbm, buf, sem):
        pltpu.async_copy(x_hbm.at[pl.ds(0, 8)], buf.at[pl.ds(0, 8)], sem)
        pltpu.async_copy(x_hbm.at[pl.ds(8, 8)], buf.at[pl.ds(8, 8)], sem)
        pl.semaphore_wait(sem, 1)
        o_hbm[...] = jnp.zeros((16, 128), jnp.float32)

    call = _hbm_call(kernel, (16, 128), pltpu.VMEM((16, 128), jnp.float32),
                     pltpu.SemaphoreType.REGULAR)
    result = check(call, X, config=Config(dma_mode=DmaMode.EAGER, tpu="v6e"))
    assert [(f.kind.value, f.buffer, f.index_range) for f in result.findings] == [
        ("dma-not-waited", "buf", ((8, 16), (0, 128)))]
    assert "count 1" in result.findings[0].message


def _zero_dma_call(kernel, semaphore):
    """A call whose first scalar-prefetched int is the size of the kernel's first copy."""
    def call(n, x):
        return pl.pallas_call(
            kernel, grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, grid=(1,),
                in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                out_specs=pl.BlockSpec(memory_space=pl.ANY),
                scratch_shapes=[pltpu.VMEM((16, 128), jnp.float32), semaphore]),
            out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32))(n, x)
    return call


def _zero_then_real_regular(n_ref, x_hbm, o_hbm, buf, sem):
    """A copy of n rows (n = 0: no bytes) and one of 8, on one REGULAR semaphore; one
    wait per copy that moves data."""
    buf[...] = jnp.zeros_like(buf)
    n = n_ref[0]
    pltpu.async_copy(x_hbm.at[pl.ds(0, n)], buf.at[pl.ds(0, n)], sem)
    pltpu.async_copy(x_hbm.at[pl.ds(8, 8)], buf.at[pl.ds(8, 8)], sem)
    pl.semaphore_wait(sem, 1)

    @pl.when(n > 0)
    def _():
        pl.semaphore_wait(sem, 1)

    pltpu.sync_copy(buf, o_hbm)


def _zero_then_real_dma(n_ref, x_hbm, o_hbm, buf, sem):
    """The same on a DMA semaphore, each copy waited by its own descriptor: the empty
    one's wait takes 0 bytes."""
    buf[...] = jnp.zeros_like(buf)
    n = n_ref[0]
    empty = pltpu.make_async_copy(x_hbm.at[pl.ds(0, n)], buf.at[pl.ds(0, n)], sem)
    real = pltpu.make_async_copy(x_hbm.at[pl.ds(8, 8)], buf.at[pl.ds(8, 8)], sem)
    empty.start()
    real.start()
    empty.wait()
    real.wait()
    pltpu.sync_copy(buf, o_hbm)


_REGULAR = (_zero_then_real_regular, pltpu.SemaphoreType.REGULAR)
_DMA = (_zero_then_real_dma, pltpu.SemaphoreType.DMA)


@pytest.mark.parametrize("kernel, semaphore, n, mode", [
    *((*_REGULAR, 0, mode) for mode in MODES), (*_REGULAR, 3, DmaMode.ON_WAIT),
    (*_DMA, 0, DmaMode.ON_WAIT), (*_DMA, 0, DmaMode.RANDOM), (*_DMA, 3, DmaMode.EAGER)],
    ids=["regular-0-on_wait", "regular-0-eager", "regular-0-random", "regular-3",
         "dma-0-on_wait", "dma-0-random", "dma-3"])
def test_a_dma_of_no_bytes_signals_nothing(check, kernel, semaphore, n, mode):
    """A DMA that moves no bytes signals nothing on either semaphore type (JAX's
    interpreter signals a DMA's bytes, 0; a kernel like this runs clean on a v6e): no
    dma-not-waited, no count left over; before, a regular semaphore got +1 and the
    real copy was reported never waited."""
    config = Config(tpu="v6e", dma_mode=mode, races=True,
                    schedules=5 if mode == DmaMode.RANDOM else 1)
    out = _clean(check(_zero_dma_call(kernel, semaphore), np.array([n], np.int32), X,
                       config=config))
    want = np.zeros((16, 128), np.float32)
    want[:n] = X[:n]
    want[8:] = X[8:]
    np.testing.assert_array_equal(out, want)


def test_a_wait_for_an_empty_dma_on_a_regular_semaphore_deadlocks(check):
    """Nothing signals it: a TPU hangs there, and so the wait is a deadlock finding."""
    def kernel(n_ref, x_hbm, o_hbm, buf, sem):
        n = n_ref[0]
        pltpu.async_copy(x_hbm.at[pl.ds(0, n)], buf.at[pl.ds(0, n)], sem)
        pl.semaphore_wait(sem, 1)
        pltpu.sync_copy(buf, o_hbm)

    result = check(_zero_dma_call(kernel, pltpu.SemaphoreType.REGULAR),
                   np.array([0], np.int32), X, config=Config(tpu="v6e"))
    assert [f.kind.value for f in result.findings] == ["deadlock"], [
        f.message for f in result.findings]
    assert "reach 1 (it is 0)" in result.findings[0].message


def test_a_remote_copy_signals_regular_send_and_receive_semaphores_once(check):
    mesh = pltpu.create_tensorcore_mesh("core", num_cores=2)

    @pl.kernel(out_type=jax.ShapeDtypeStruct((16, 128), jnp.float32), mesh=mesh,
               scratch_types=[pltpu.VMEM((8, 128), jnp.float32),
                              pltpu.VMEM((8, 128), jnp.float32),
                              pltpu.SemaphoreType.REGULAR, pltpu.SemaphoreType.REGULAR])
    def swap(x_hbm, o_hbm, mine, theirs, send_sem, recv_sem):
        core = jax.lax.axis_index("core")
        pltpu.sync_copy(x_hbm.at[pl.ds(core * 8, 8)], mine)
        pltpu.make_async_remote_copy(mine, theirs, send_sem, recv_sem,
                                     device_id={"core": 1 - core},
                                     device_id_type=pl.DeviceIdType.MESH).start()
        pl.semaphore_wait(send_sem, 1)
        pl.semaphore_wait(recv_sem, 1)
        pltpu.sync_copy(theirs, o_hbm.at[pl.ds(core * 8, 8)])

    for mode in MODES:
        out = _clean(check(swap, X, config=Config(dma_mode=mode, races=True, tpu="v7x")))
        np.testing.assert_array_equal(out, np.concatenate([X[8:], X[:8]]))


def test_a_regular_semaphore_on_an_smem_dma_is_the_kernels_error(check):
    """Mosaic's verifier: "Non-DMA semaphores are not supported for DMAs involving SMEM"."""
    def kernel(x_hbm, o_ref, buf, sem):
        pltpu.async_copy(x_hbm.at[0, pl.ds(0, 8)], buf, sem)
        pl.semaphore_wait(sem, 1)
        o_ref[...] = jnp.zeros((8, 128), jnp.float32) + buf[0]

    call = lambda x: pl.pallas_call(  # noqa: E731
        kernel, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((8, 128), lambda: (0, 0)),
        scratch_shapes=[pltpu.SMEM((8,), jnp.float32), pltpu.SemaphoreType.REGULAR],
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))(x)
    _assert_engine_error(call, "Non-DMA semaphores are not supported for DMAs involving SMEM")


def _assert_engine_error(fn, message):
    """fn(X) stops the run with pallas-check's one-line error saying `message`."""
    from pallas_check.intercept.session import Session

    session = Session(Config())
    with pytest.raises(Exception), session.install():
        jax.block_until_ready(fn(X))
    assert message in (session.engine_error or ""), session.engine_error


# -- pl.select_ref ----------------------------------------------------------------------


def _select_call(kernel, rows=8):
    def call(idx, x):
        return pl.pallas_call(
            kernel,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, grid=(1,),
                in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                out_specs=pl.BlockSpec((rows, 128), lambda i, idx: (0, 0)),
                scratch_shapes=[pltpu.VMEM((3, rows, 128), jnp.float32),
                                pltpu.SemaphoreType.DMA((3,))]),
            out_shape=jax.ShapeDtypeStruct((rows, 128), jnp.float32))(idx, x)
    return call


@pytest.mark.parametrize("idx,picked", [(0, 0), (1, 1), (2, 2), (7, 2), (-1, 2)])
def test_select_ref_picks_a_dma_destination_and_semaphore(check, idx, picked):
    """Mosaic lowers select_ref to `idx == 0` tests: refs[idx], else the last ref."""
    def kernel(idx_ref, x_hbm, o_ref, bufs, sems):
        bufs[...] = jnp.zeros_like(bufs)
        i = idx_ref[0]
        dst = pl.select_ref(i, bufs.at[0], bufs.at[1], bufs.at[2])
        sem = pl.select_ref(i, sems.at[0], sems.at[1], sems.at[2])
        copy = pltpu.make_async_copy(x_hbm.at[pl.ds(8, 8)], dst, sem)
        copy.start()
        copy.wait()
        o_ref[...] = bufs[0] + 10.0 * bufs[1] + 100.0 * bufs[2]

    out = _clean(check(_select_call(kernel), jnp.array([idx], jnp.int32), X,
                       config=Config(races=True)))
    np.testing.assert_array_equal(out, np.asarray(X[8:]) * 10.0 ** picked)


@pytest.mark.parametrize("use_second", [0, 1])
def test_select_ref_of_views_reads_only_the_picked_one(check, use_second):
    """The ref not picked is never accessed: its slice past the end is no finding."""
    def kernel(idx_ref, x_hbm, o_ref, bufs, sems):
        start = jnp.where(idx_ref[0] == 0, 4, 100)  # in bounds only where it is picked
        src = pl.select_ref(idx_ref[0], x_hbm.at[pl.ds(start, 8)], x_hbm.at[pl.ds(8, 8)])
        pltpu.async_copy(src, bufs.at[0], sems.at[0]).wait()
        o_ref[...] = bufs[0]

    out = _clean(check(_select_call(kernel), jnp.array([use_second], jnp.int32), X))
    np.testing.assert_array_equal(out, X[8:] if use_second else X[4:12])


def test_select_ref_then_indexed(check):
    def kernel(idx_ref, x_hbm, o_ref, bufs, sems):
        src = pl.select_ref(idx_ref[0], x_hbm.at[pl.ds(0, 8)], x_hbm.at[pl.ds(8, 8)])
        pltpu.async_copy(src.at[pl.ds(2, 4)], bufs.at[0, pl.ds(0, 4)], sems.at[0]).wait()
        o_ref[pl.ds(0, 4)] = bufs[0, pl.ds(0, 4)]
        o_ref[pl.ds(4, 4)] = jnp.zeros((4, 128), jnp.float32)

    out = _clean(check(_select_call(kernel), jnp.array([1], jnp.int32), X))
    np.testing.assert_array_equal(out[:4], X[10:14])


# -- pl.semaphore_signal(..., core_index=i) ---------------------------------------------


@pytest.mark.parametrize("mode", [DmaMode.ON_WAIT, DmaMode.EAGER])
@pytest.mark.parametrize("first", [0, 1])
def test_core_index_signal_wakes_the_other_core(check, first, mode):
    """JAX's test_allocate_shared_buffer_in_core_map: one core signals the other's
    semaphore. Before: the signal went to the signaller's own semaphore (deadlock). On a
    chip with two TensorCores (v7x): on a v5e the cores run one after another and the
    kernel hangs (tests/engine/call/test_serial.py)."""
    second = 1 - first
    mesh = pltpu.create_tensorcore_mesh("x", num_cores=2)

    def f(x):
        def inner(refs):
            x_ref, y_ref = refs

            @pl.core_map(mesh)
            def _():
                def body(sem):
                    @pl.when(jax.lax.axis_index("x") == second)
                    def _():
                        pl.semaphore_wait(sem, 1)

                    pltpu.sync_copy(x_ref, y_ref)

                    @pl.when(jax.lax.axis_index("x") == first)
                    def _():
                        pl.semaphore_signal(sem, 1, core_index=second)

                pl.run_scoped(body, pltpu.SemaphoreType.REGULAR)

        return pl.run_state(inner)((x, jnp.zeros_like(x)))[1]

    out = _clean(check(jax.jit(f), X, config=Config(dma_mode=mode, races=True, tpu="v7x")))
    np.testing.assert_array_equal(out, X)


def test_core_index_signals_on_a_megacore_grid(check):
    """`--cores 2`: the two halves of a parallel grid axis run on the two TensorCores of
    the chip; each writes its half of `stage`, tells the other core, and reads the
    other's half."""
    def kernel(x_hbm, o_ref, stage_hbm, buf, sem):
        me = pl.program_id(0)
        other = 1 - me
        pltpu.sync_copy(x_hbm.at[pl.ds(me * 8, 8)], buf)
        pltpu.sync_copy(buf, stage_hbm.at[pl.ds(me * 8, 8)])
        pl.semaphore_signal(sem, 1, core_index=other)
        pl.semaphore_wait(sem, 1)
        pltpu.sync_copy(stage_hbm.at[pl.ds(other * 8, 8)], buf)
        o_ref[...] = buf[...]

    def call(x):
        return pl.pallas_call(
            kernel, grid=(2,), in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0)),
                       pl.BlockSpec(memory_space=pl.ANY)],
            scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.REGULAR],
            out_shape=[jax.ShapeDtypeStruct((16, 128), jnp.float32)] * 2,
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)))(x)

    result = check(call, X, config=Config(cores=2, races=True))
    assert result.session.engine_error is None, result.session.engine_error
    assert result.findings == [], [f.message for f in result.findings]
    np.testing.assert_array_equal(result.value[0], np.concatenate([X[8:], X[:8]]))


def _signal_kernel_call(**signal):
    mesh = pltpu.create_tensorcore_mesh("core", num_cores=2)

    @pl.kernel(out_type=jax.ShapeDtypeStruct((8, 128), jnp.float32), mesh=mesh,
               scratch_types=[pltpu.SemaphoreType.REGULAR])
    def kernel(x_hbm, o_hbm, sem):
        pl.semaphore_signal(sem, 1, **signal)
        pl.semaphore_wait(sem, 1)

        @pl.when(jax.lax.axis_index("core") == 0)
        def _():
            pltpu.sync_copy(x_hbm.at[pl.ds(0, 8)], o_hbm)

    return kernel


@pytest.mark.parametrize("signal,message", [
    (dict(core_index=2), "core_index 2 is outside the 2 TensorCore"),
    (dict(core_index=0, device_id={"core": 1}), "Cannot specify both `core_index`"),
])
def test_a_core_index_the_lowering_rejects_is_an_error(signal, message):
    _assert_engine_error(_signal_kernel_call(**signal), message)


# -- the samples of these features under every DMA mode ---------------------------------


@pytest.mark.parametrize("options", ["--dma random --schedules 20 --races", "--dma eager --races"])
@pytest.mark.parametrize("name", ["regular_sem_dma_ok.py", "select_ref_ok.py",
                                  "core_signal_ok.py", "zero_dma_regular_ok.py"])
def test_ok_samples_are_clean_whenever_dmas_land(cli, sample, name, options):
    """(With the chip the sample's `Run:` line names: core_signal_ok is for two
    TensorCores, `--tpu v7x`.)"""
    result = cli("run", *options.split(), *run_args(Path(sample(name))).split(), sample(name))
    assert result.report is not None, result.output
    assert result.report["user_error"] is None, result.report["user_traceback"]
    assert result.report["findings"] == [], result.report["findings"]
    assert result.exit_code == 0 and "output matches" in result.output
