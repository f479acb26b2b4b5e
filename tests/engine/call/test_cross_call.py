"""Semaphores and DMAs that cross pallas_call boundaries (engine/call/carried.py).

JAX's async-copy pattern: a call starts a DMA and returns its semaphore (an out_shape of
`pltpu.SemaphoreType.DMA(...)`, its BlockSpec in `pltpu.SEMAPHORE`) with the copy in
flight; a later call takes the semaphore and waits. On a TPU the semaphore keeps its count
and the DMAs still to signal it from one call to the next. Every expectation here is the
TPU's: the copied data, and each defect where the kernels leave a DMA or count behind.
"""

from __future__ import annotations

import functools
import inspect
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from _cli_worker import run_cli

from pallas_check.config import Config, DmaMode
from pallas_check.findings.finding import FindingKind

ANY = pl.BlockSpec(memory_space=pl.ANY)
SEM = pl.BlockSpec(memory_space=pltpu.SEMAPHORE)
MODES = [DmaMode.ON_WAIT, DmaMode.EAGER, DmaMode.RANDOM]


def _line_of(fn, text: str) -> int:
    """The file line of the first line of `fn` that contains `text`."""
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def _finished(checked) -> list:
    """The findings once the script has ended (semaphores no call took are checked)."""
    checked.session.finish()
    checked.findings = checked.session.findings
    return checked.findings


# -- the kernels (one copy x -> out started in one call, waited in the next) ---------------

def start_kernel(x_ref, x_alias, o_ref, sem):
    del x_alias
    pltpu.make_async_copy(x_ref, o_ref, sem).start()


def done_kernel(x_ref, o_ref, sem, o_alias):
    del o_alias
    pltpu.make_async_copy(x_ref, o_ref, sem).wait()


def no_wait_kernel(x_ref, o_ref, sem, o_alias):
    del x_ref, o_ref, sem, o_alias  # BUG: the copy is never waited


def early_read_kernel(x_ref, o_ref, sem, o_alias, y_ref, sem2):
    del o_alias
    early = pltpu.make_async_copy(o_ref, y_ref, sem2)  # BUG: reads o_ref before the wait
    early.start()
    early.wait()
    pltpu.make_async_copy(x_ref, o_ref, sem).wait()


def copy_start(x, space=None):
    space = space or pl.ANY
    x, out, sem = pl.pallas_call(
        start_kernel,
        out_shape=(jax.ShapeDtypeStruct(x.shape, x.dtype), space(x.shape, x.dtype),
                   pltpu.SemaphoreType.DMA(())),
        in_specs=[ANY],
        out_specs=(ANY, pl.BlockSpec(memory_space=space), SEM),
        input_output_aliases={0: 0})(x)
    return x, (out, sem)


def copy_done(x, fut, space=None, kernel=done_kernel):
    space = space or pl.ANY
    out, sem = fut
    return pl.pallas_call(
        kernel, out_shape=space(x.shape, x.dtype),
        in_specs=[ANY, pl.BlockSpec(memory_space=space), SEM],
        out_specs=pl.BlockSpec(memory_space=space), input_output_aliases={1: 0})(x, out, sem)


def row_start_kernel(i_ref, x_ref, x_alias, o_ref, sem):
    del x_alias
    pltpu.make_async_copy(x_ref.at[i_ref[0]], o_ref, sem).start()


def row_done_kernel(x_ref, o_ref, sem, o_alias):
    del o_alias
    pltpu.make_async_copy(x_ref.at[0], o_ref, sem).wait()  # any row: the same bytes


def row_start(x, i):
    x, out, sem = pl.pallas_call(
        row_start_kernel,
        out_shape=(jax.ShapeDtypeStruct(x.shape, x.dtype),
                   jax.ShapeDtypeStruct(x.shape[1:], x.dtype), pltpu.SemaphoreType.DMA(())),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, in_specs=[ANY], out_specs=(ANY, ANY, SEM)),
        input_output_aliases={1: 0})(jnp.asarray(i, jnp.int32)[None], x)
    return x, (out, sem)


def row_done(x, fut):
    out, sem = fut
    return pl.pallas_call(
        row_done_kernel, out_shape=jax.ShapeDtypeStruct(x.shape[1:], x.dtype),
        in_specs=[ANY, ANY, SEM], out_specs=ANY, input_output_aliases={1: 0})(x, out, sem)


# -- the patterns, as JAX's own tests write them ------------------------------------------

def basic(x):
    return copy_done(x[0], copy_start(x[0])[1]), x[0]


def into_vmem(x):
    start = functools.partial(copy_start, space=pltpu.VMEM)
    return copy_done(x[0], start(x[0])[1], space=pltpu.VMEM), x[0]


def two_in_flight(x):
    x1, fut1 = copy_start(x[0])
    x2, fut2 = copy_start(x1)
    return jnp.stack([copy_done(x1, fut1), copy_done(x2, fut2)]), jnp.stack([x[0], x[0]])


def staggered_loop(x):
    y, fut = copy_start(x)

    def body(_, carry):
        return copy_start(copy_done(*carry))

    y, fut = jax.lax.fori_loop(0, 3, body, (y, fut), unroll=2)
    return copy_done(y, fut), x


def staggered_rows(x):
    ys = jnp.zeros_like(x)
    y, fut = row_start(x, 0)

    def body(i, carry):
        y, fut, ys = carry
        ys = ys.at[i].set(row_done(y, fut))
        y, fut = row_start(y, i + 1)
        return y, fut, ys

    y, fut, ys = jax.lax.fori_loop(0, x.shape[0] - 1, body, (y, fut, ys))
    return ys.at[x.shape[0] - 1].set(row_done(y, fut)), x


PATTERNS = [basic, into_vmem, two_in_flight, staggered_loop, staggered_rows]
X = jnp.arange(4 * 8 * 128, dtype=jnp.float32).reshape(4, 8, 128)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("pattern", PATTERNS, ids=lambda p: p.__name__)
def test_copy_started_in_one_call_waited_in_the_next(check, pattern, mode):
    """Today's main: TypeError "Cannot interpret 'dma_sem' as a data type" at the first
    call. The data arrives, and nothing is reported, in every DMA mode."""
    checked = check(jax.jit(pattern), X,
                    config=Config(dma_mode=mode, races=True, schedules=3))
    got, want = checked.value
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert _finished(checked) == [], [f.message for f in checked.findings]


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_a_dma_never_waited_is_reported_where_it_started(check, mode):
    """The call that takes the semaphore never waits: when it ends (the semaphore's last
    holder) the DMA is `dma-not-waited`, at the line of the call that started it."""
    checked = check(jax.jit(lambda x: copy_done(x, copy_start(x)[1], kernel=no_wait_kernel)),
                    X[0], config=Config(dma_mode=mode))
    np.testing.assert_array_equal(np.asarray(checked.value), np.asarray(X[0]))
    (finding,) = checked.findings
    assert finding.kind == FindingKind.DMA_NOT_WAITED
    assert finding.buffer == "o_ref" and finding.index_range == ((0, 8), (0, 128))
    assert finding.frames[0].line == _line_of(start_kernel, ".start()")
    assert finding.call_index == 1 and finding.kernel.name == "no_wait_kernel"
    assert "started in call #0 (start_kernel)" in finding.message


def test_a_semaphore_no_call_takes_is_reported_at_the_end_of_the_script(check):
    checked = check(jax.jit(lambda x: copy_start(x)[1][0]), X[0])
    np.testing.assert_array_equal(np.asarray(checked.value), np.asarray(X[0]))
    assert checked.findings == []  # the copy may still be waited by a later call...
    (finding,) = _finished(checked)  # ...until the script ends
    assert finding.kind == FindingKind.DMA_NOT_WAITED
    assert finding.call_index == 0 and finding.buffer == "o_ref"
    assert finding.frames[0].line == _line_of(start_kernel, ".start()")
    assert "taken by no later call" in finding.message


def _early_read(x):
    x, (out, sem) = copy_start(x)
    return pl.pallas_call(
        early_read_kernel, out_shape=(jax.ShapeDtypeStruct(x.shape, x.dtype),) * 2,
        in_specs=[ANY, ANY, SEM], out_specs=(ANY, ANY),
        scratch_shapes=[pltpu.SemaphoreType.DMA], input_output_aliases={1: 0})(x, out, sem)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_reading_the_destination_before_the_wait_races_with_the_landing(check, mode):
    """The next call reads the copy's destination before it waits: a race with the DMA's
    write (whenever it landed), and in `on_wait` the read sees what was there before."""
    checked = check(jax.jit(_early_read), X[0], config=Config(dma_mode=mode, races=True))
    races = [f for f in checked.findings if f.kind == FindingKind.RACE]
    assert len(races) == 1, [f.message for f in checked.findings]
    assert races[0].buffer == "o_ref" and races[0].index_range == ((0, 8), (0, 128))
    assert {a.operation for a in races[0].accesses} == {"DMA write", "DMA read"}
    out, early = checked.value
    np.testing.assert_array_equal(np.asarray(out), np.asarray(X[0]))
    if mode == DmaMode.ON_WAIT:
        assert np.isnan(np.asarray(early)).all()  # it had not landed
        assert FindingKind.UNINITIALIZED in {f.kind for f in checked.findings}


# -- pl.core_map kernels sharing refs made with pl.empty_ref_like --------------------------

CORE_MESH = pltpu.create_tensorcore_mesh("core", num_cores=1)


def _core_map_copy(wait: bool):
    """Three core_map kernels over refs of the enclosing jit: fill an SMEM ref, start its
    copy to an HBM ref on a DMA semaphore made with `pl.empty_ref_like`, wait for it."""
    kernel = pl.core_map(mesh=CORE_MESH)

    def run():
        src = pl.empty_ref_like(pltpu.SMEM((8,), jnp.int32))
        dst = pl.empty_ref_like(pltpu.HBM((8,), jnp.int32))
        sem = pl.empty_ref_like(pltpu.SemaphoreType.DMA(()))

        @kernel
        def _():
            for i in range(8):
                src[i] = 3 * i

        @kernel
        def _():
            pltpu.make_async_copy(src, dst, sem).start()

        if wait:
            @kernel
            def _():
                pltpu.make_async_copy(src, dst, sem).wait()

        return dst[...]

    return run


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_core_map_kernels_share_a_dma_semaphore(check, mode):
    """Today's main: the SMEM ref the first kernel fills reads back as never written, and
    the semaphore crashes the second kernel."""
    checked = check(jax.jit(_core_map_copy(wait=True)), config=Config(dma_mode=mode))
    np.testing.assert_array_equal(np.asarray(checked.value), 3 * np.arange(8))
    assert _finished(checked) == [], [f.message for f in checked.findings]


def test_core_map_copy_never_waited(check):
    checked = check(jax.jit(_core_map_copy(wait=False)))
    np.testing.assert_array_equal(np.asarray(checked.value), 3 * np.arange(8))
    (finding,) = _finished(checked)
    assert finding.kind == FindingKind.DMA_NOT_WAITED and finding.call_index == 1
    assert finding.frames[0].line == _line_of(_core_map_copy, ".start()")


# -- counts carried: a regular semaphore signalled in one call, waited in the next --------

def signal_kernel(sem):
    pl.semaphore_signal(sem, 3)


def wait_kernel(sem, *, amount):
    pl.semaphore_wait(sem, amount)


def _signal_then_wait(amount):
    def run(x):
        sem = pl.pallas_call(signal_kernel, out_shape=pltpu.SemaphoreType.REGULAR(()),
                             out_specs=SEM)()
        pl.pallas_call(functools.partial(wait_kernel, amount=amount), out_shape=(),
                       in_specs=[SEM])(sem)
        return x + 1

    return run


def test_a_count_carried_and_waited_is_clean(check):
    checked = check(jax.jit(_signal_then_wait(3)), X[0])
    assert _finished(checked) == []


def test_a_count_left_at_the_last_holder_is_a_leak(check):
    checked = check(jax.jit(_signal_then_wait(2)), X[0])
    (finding,) = _finished(checked)
    assert finding.kind == FindingKind.SEMAPHORE_LEAK
    assert finding.call_index == 1 and finding.details["count"] == 1
    assert finding.frames[0].line == _line_of(signal_kernel, "semaphore_signal")


# -- the samples under every DMA mode ----------------------------------------------------

SAMPLES = Path(__file__).resolve().parents[3] / "samples"


@pytest.mark.parametrize("args", ["--dma eager", "--dma random --schedules 20",
                                  "--dma on_wait --schedules 4"])
def test_cross_call_samples_under_every_dma_mode(cli, args):
    """The fixed sample is clean however its DMAs land; the bug's forgotten wait is
    found each way (the early read races with the landing, wherever that lands)."""
    ok = cli("run", "--races", *args.split(), str(SAMPLES / "cross_call_dma_ok.py"))
    assert ok.exit_code == 0 and ok.report["findings"] == [], ok.output
    assert "output matches" in ok.output
    bug = cli("run", "--races", *args.split(), str(SAMPLES / "cross_call_dma_bug.py"))
    assert bug.exit_code == 1, bug.output
    kinds = {(f["kind"], f["buffer"]) for f in bug.report["findings"]}
    assert {("dma-not-waited", "o_hbm"), ("race", "o_hbm")} <= kinds, kinds


# -- two devices: a remote copy started in one call, its two halves waited in two more ----

REMOTE = Path(__file__).resolve().parents[2] / "scripts" / "remote_cross_call.py"


def _run_two_devices(tmp_path, variant: str, mode: DmaMode) -> tuple[int, str, list]:
    """The CLI in a worker process of its own (XLA_FLAGS for 2 CPU devices is read at
    start; tests/_cli_worker.py)."""
    report = tmp_path / f"{variant}-{mode.value}.json"
    proc = run_cli(
        ["run", "--devices", "2", "--races", "--dma",
         mode.value, "--format", "json", "--output", str(report), str(REMOTE), variant],
        timeout=600)
    findings = json.loads(report.read_text())["findings"] if report.exists() else []
    return proc.returncode, proc.stdout + proc.stderr, findings


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_remote_copy_split_across_calls_on_two_devices(tmp_path, mode):
    """Today's main: exit 4, "Cannot interpret 'dma_sem' as a data type"."""
    code, output, findings = _run_two_devices(tmp_path, "ok", mode)
    assert code == 0, output
    assert findings == [] and "remote_cross_call: output matches" in output


def test_remote_copy_never_waited_on_either_side(tmp_path):
    code, output, findings = _run_two_devices(tmp_path, "no_recv_wait", DmaMode.ON_WAIT)
    assert code == 1, output
    (finding,) = findings  # one per device, merged
    assert finding["kind"] == "dma-not-waited" and finding["buffer"] == "o_ref"
    assert finding["count"] == 2 and finding["call_index"] == 0
    assert finding["frames"][0]["line"] == _line_of_text(REMOTE, ").start()")
    code, output, findings = _run_two_devices(tmp_path, "no_send_wait", DmaMode.ON_WAIT)
    assert code == 1, output
    (finding,) = findings
    assert finding["kind"] == "semaphore-leak" and finding["buffer"] == "send_sem"
    assert finding["details"]["count"] == 8 * 128 * 4


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_remote_copy_read_before_its_wait_races_on_two_devices(tmp_path, mode):
    """The receiving call reads the destination before it waits: a race with the remote
    DMA's landing, found on each device (the destination found by what it holds: several
    devices' operands are copies, not lent buffers)."""
    code, output, findings = _run_two_devices(tmp_path, "early_read", mode)
    assert code == 1, output
    races = [f for f in findings if f["kind"] == "race"]
    assert len(races) == 1 and races[0]["buffer"] == "o_ref", findings
    assert races[0]["count"] == 2 and races[0]["call_index"] == 2


def _line_of_text(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)
