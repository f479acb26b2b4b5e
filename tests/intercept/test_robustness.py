"""Robust runs: engine state belongs to one call, the report is always written, threads of
the user's script are checked without crosstalk, and memory stays bounded on long kernels.

Already covered in tests/cli/test_cli.py (not repeated here): the report on findings, on the
script raising, on `sys.exit()`, on a KeyboardInterrupt raised by the script itself, and
atomic `--output` files. Here: that every exit 4 lists the calls made, the failing one marked.
"""

from __future__ import annotations

import textwrap
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_check.intercept import patched_lowering as intercept
from pallas_check.checkers.races import RaceChecker
from pallas_check.config import Config, DmaMode, Tier
from pallas_check.engine.call import describe, explore, simulate
from pallas_check.config.exitcodes import ExitCode
from pallas_check.intercept.session import Session


# ---------------------------------------------------------------------------------------
# Kernels.


def _scale_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 3.0 + 1.0


def scale(x):
    return pl.pallas_call(
        _scale_kernel, grid=(x.shape[0] // 8,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def _half_kernel(x_ref, o_ref):
    o_ref[:4, :] = x_ref[:4, :]  # rows 4:8 of every block are never written


def half(x):
    return pl.pallas_call(
        _half_kernel, grid=(x.shape[0] // 8,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def _global_sem_kernel(x_ref, o_ref):
    sem = pl.get_global(pltpu.SemaphoreType.REGULAR)  # unsupported: fails before running
    pl.semaphore_signal(sem)
    pl.semaphore_wait(sem)
    o_ref[...] = x_ref[...]


def unsupported(x):
    return pl.pallas_call(_global_sem_kernel, grid=(1,),
                          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def _sem_per_step_kernel(x_ref, o_ref, sems):
    i = pl.program_id(0)
    o_ref[...] = x_ref[...]
    pl.semaphore_signal(sems.at[i])  # sems has 2 cells: step 2 raises mid-simulation
    pl.semaphore_wait(sems.at[i])


def fails_at_step_2(x):
    return pl.pallas_call(
        _sem_per_step_kernel, grid=(x.shape[0] // 8,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.SemaphoreType.REGULAR((2,))])(x)


X = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)


def run_in(session: Session, fn, *args):
    with session.install():
        return np.asarray(jax.block_until_ready(fn(*args)))


def assert_no_global_state_left() -> None:
    """What a session installs is gone once it ends, however it ended."""
    from jax._src.pallas import pallas_call as pallas_call_module
    from jax._src.pallas.mosaic import tpu_info as jax_tpu_info

    assert intercept._saved is None
    assert pallas_call_module._pallas_call_lowering.__module__ != intercept.__name__
    assert jax_tpu_info.get_device_kind.__module__ != "pallas_check.intercept.tpu_info"
    assert jax.config.jax_default_device is None


# ---------------------------------------------------------------------------------------
# Engine state belongs to one call.


@pytest.mark.parametrize("failing", [unsupported, fails_at_step_2],
                         ids=["unsupported-primitive", "raises-mid-simulation"])
def test_an_engine_error_poisons_neither_the_next_call_nor_the_next_session(failing):
    first = Session(Config(races=True))
    with pytest.raises(Exception):
        run_in(first, failing, X)
    assert first.engine_error is not None
    assert_no_global_state_left()
    # The same session goes on: the next call is simulated from scratch.
    np.testing.assert_array_equal(run_in(first, scale, X), np.asarray(X) * 3.0 + 1.0)
    assert first.findings == []
    # A new session knows nothing of the failure.
    second = Session(Config(races=True))
    np.testing.assert_array_equal(run_in(second, scale, X), np.asarray(X) * 3.0 + 1.0)
    assert second.engine_error is None and second.findings == []
    out = run_in(second, half, X)
    assert [(f.kind.value, f.call_index, f.index_range) for f in second.findings] == [
        ("unwritten-output", 1, ((4, 32), (0, 128)))]
    np.testing.assert_array_equal(out.reshape(4, 8, 128)[:, :4],
                                  np.asarray(X).reshape(4, 8, 128)[:, :4])
    assert_no_global_state_left()


def test_an_error_in_one_schedule_leaves_the_others_clean(monkeypatch):
    """Schedule exploration: each schedule is a fresh simulation."""
    session = Session(Config(schedules=3, keep_going=True, races=True))
    np.testing.assert_array_equal(run_in(session, scale, X), np.asarray(X) * 3.0 + 1.0)
    assert session.findings == [] and session.engine_error is None
    original = explore._one_schedule
    calls = []

    def second_schedule_fails(call, run):
        calls.append(run.config.seed)
        if len(calls) == 2:
            raise RuntimeError("schedule 2 broke")
        return original(call, run)

    monkeypatch.setattr(explore, "_one_schedule", second_schedule_fails)
    with pytest.raises(Exception):
        run_in(session, scale, X)
    assert "schedule 2 broke" in session.engine_error
    monkeypatch.setattr(explore, "_one_schedule", original)
    fresh = Session(Config(schedules=3, keep_going=True))
    out = run_in(fresh, half, X)
    assert [f.kind.value for f in fresh.findings] == ["unwritten-output"]
    assert out.shape == X.shape
    assert_no_global_state_left()


# ---------------------------------------------------------------------------------------
# The report is always written (what tests/cli/test_cli.py does not cover yet).

PRELUDE = '''\
import sys
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def half_kernel(x_ref, o_ref):
    o_ref[:4, :] = x_ref[:4, :]


def half(x):
    return pl.pallas_call(
        half_kernel, grid=(x.shape[0] // 8,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def global_sem_kernel(x_ref, o_ref):
    sem = pl.get_global(pltpu.SemaphoreType.REGULAR)
    pl.semaphore_signal(sem)
    pl.semaphore_wait(sem)
    o_ref[...] = x_ref[...]


X = jnp.zeros((16, 128), jnp.float32)
'''


def script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "script.py"
    path.write_text(PRELUDE + textwrap.dedent(body))
    return str(path)


def test_internal_error_keeps_what_was_found_so_far(cli, tmp_path):
    result = cli("run", script(tmp_path, """
        jax.block_until_ready(half(X))
        jax.block_until_ready(pl.pallas_call(
            global_sem_kernel, out_shape=jax.ShapeDtypeStruct(X.shape, X.dtype))(X))
        print("not reached")
    """))
    assert result.exit_code == ExitCode.INTERNAL
    assert result.report["exit_code"] == ExitCode.INTERNAL
    assert "'get_global'" in result.report["internal_error"]
    assert [f["kind"] for f in result.findings] == ["unwritten-output"]
    # The call made before the failure, and the failing call, marked.
    assert [c["failed"] for c in result.report["calls"]] == [False, True]


_KERNEL_INFO = describe.kernel_info


def _fails_for_double_kernel(original):
    """`original`, raising an error of ours on `double_kernel`'s call."""

    def fails(params, *args, **kwargs):
        if _KERNEL_INFO(params).name == "double_kernel":
            raise RuntimeError("simulated bug of ours")
        return original(params, *args, **kwargs)

    return fails


@pytest.mark.parametrize("fails_in", ["kernel_info", "run_call_devices", None])
def test_every_failure_of_ours_lists_the_calls_made(cli, tmp_path, monkeypatch, fails_in):
    """Exit 4 wherever our handler fails: naming the kernel before the engine runs, inside
    the engine, or on a primitive it does not support (None). The report lists the call
    before and the failing one, marked, by its kernel's name (`pallas_call` when naming it
    is what failed)."""
    failing = "global_sem_kernel" if fails_in is None else "double_kernel"
    listed = "pallas_call" if fails_in == "kernel_info" else failing
    if fails_in is not None:
        home = describe if fails_in == "kernel_info" else explore
        monkeypatch.setattr(home, fails_in, _fails_for_double_kernel(getattr(home, fails_in)))
    result = cli("run", script(tmp_path, f"""
        def double_kernel(x_ref, o_ref):
            o_ref[...] = x_ref[...] * 2.0

        jax.block_until_ready(half(X))
        jax.block_until_ready(pl.pallas_call(
            {failing}, out_shape=jax.ShapeDtypeStruct(X.shape, X.dtype))(X))
        print("not reached")
    """))
    assert result.exit_code == ExitCode.INTERNAL
    assert result.report["internal_error"]
    assert [(c["kernel"], c["failed"]) for c in result.report["calls"]] == [
        ("half_kernel", False), (listed, True)]


def test_a_rendezvous_timeout_lists_the_call_once():
    """Every device left waiting times out on its own thread: the call is listed once,
    failed, and the run's error is the first device's."""
    from pallas_check.engine.runtime.rendezvous import RendezvousTimeout
    from pallas_check.intercept.session import EngineFailure

    class NeverMet:
        def meet(self, device, num_devices, operands, run):
            raise RendezvousTimeout(f"device {device} waited; the others never came")

    session = Session(Config())
    session._meeting_point = NeverMet()
    for device in (0, 1):
        with pytest.raises(EngineFailure, match="device 0 waited"):
            session.handle_call({}, [np.zeros(4)], device=device, mesh_axes=(("x", 2),))
    assert [(c.kernel, c.failed, c.devices) for c in session.calls] == [
        ("pallas_call", True, 2)]


def test_sys_exit_after_findings_keeps_them(cli, tmp_path):
    result = cli("run", script(tmp_path, "jax.block_until_ready(half(X))\nsys.exit(7)\n"))
    assert result.exit_code == ExitCode.USER_ERROR
    assert result.report["user_error"] == "the script exited with code 7"
    assert [f["kind"] for f in result.findings] == ["unwritten-output"]
    assert result.report["partial"] is False


def test_ctrl_c_during_a_simulation_is_a_partial_report(cli, tmp_path, monkeypatch):
    """The host callback runs on the main thread, so Ctrl-C can land inside the engine;
    JAX then hands the script its own runtime error. It is still an interruption."""
    original = explore.run_call_devices
    count = []

    def interrupted_on_call_2(*args, **kwargs):
        if kwargs.get("live") is not None:  # a checked call (not intercept/judge.py's re-run of one)
            count.append(1)
        if len(count) == 2:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(explore, "run_call_devices", interrupted_on_call_2)
    result = cli("run", script(tmp_path, """
        jax.block_until_ready(half(X))
        jax.block_until_ready(half(X + 1))
        print("not reached")
    """))
    assert result.exit_code == ExitCode.USER_ERROR
    report = result.report
    assert report["partial"] is True
    assert report["user_error"] == "interrupted (Ctrl-C)"
    assert report["user_traceback"] is None and report["internal_error"] is None
    assert [f["kind"] for f in result.findings] == ["unwritten-output"]
    # The call the run stopped in is listed as interrupted (it never got to simulate).
    assert [(c["interrupted"], c["progress"]) for c in report["calls"]] == [
        (False, None), (True, {"steps_done": 0, "steps_total": 0})]
    assert "not reached" not in result.output
    assert "Traceback" not in result.stderr


# ---------------------------------------------------------------------------------------
# Concurrent pallas_calls from several threads of the user's script.

THREADS_SCRIPT = '''
import threading
import numpy as np


def scale_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 3.0 + 1.0


def scale(x):
    return pl.pallas_call(
        scale_kernel, grid=(x.shape[0] // 8,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


ROUNDS = 3
errors = []
start = threading.Barrier(4)


def worker(t):
    try:
        start.wait()
        for r in range(ROUNDS):
            # Each thread has its own shape (so its own grid) and values.
            x = jnp.full((16 + 8 * t, 128), float(10 * t + r), jnp.float32)
            if t % 2 == 0:
                out = np.asarray(jax.jit(scale)(x))
                np.testing.assert_array_equal(out, np.asarray(x) * 3.0 + 1.0)
            else:
                out = np.asarray(half(x)).reshape(-1, 8, 128)
                np.testing.assert_array_equal(out[:, :4], np.asarray(x).reshape(-1, 8, 128)[:, :4])
    except BaseException as exc:
        errors.append(f"thread {t}: {exc!r}")


threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
assert not errors, errors
print("all threads checked their outputs")
'''


def test_calls_from_four_threads_are_checked_without_crosstalk(cli, tmp_path, monkeypatch):
    original = explore.run_call_devices
    lock = threading.Lock()
    in_flight, most, per_call, arrived = [0], [0], {}, [0]
    # The first two calls to arrive (from two threads: a thread's next call waits for its
    # last) wait for each other inside the engine: the calls overlap, by construction, not
    # by luck of timing. The timeout only turns a regression that serialises calls into a
    # failure instead of a hang.
    first_two = threading.Barrier(2, timeout=120)

    def observed(params, device_operands, config, call_index, *args, **kwargs):
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
            arrived[0] += 1
            meets = arrived[0] <= 2
        try:
            if meets:
                first_two.wait()
            result = original(params, device_operands, config, call_index, *args, **kwargs)
        finally:
            with lock:
                in_flight[0] -= 1
        # Copies: the test looks at them after the call's buffers are gone.
        outputs = [np.array(o) for o in result.outputs[0]]
        per_call[call_index] = (describe.kernel_info(params).name,
                                np.array(device_operands[0][0]), (outputs, result.findings))
        return result

    monkeypatch.setattr(explore, "run_call_devices", observed)
    # The engine's handling of threads is what is tested (a structure called often enough
    # would run compiled).
    result = cli("run", "--tier", "engine", script(tmp_path, THREADS_SCRIPT))
    assert result.exit_code == ExitCode.FINDINGS, result.output
    assert "all threads checked their outputs" in result.output
    assert most[0] >= 2, "the calls never overlapped: the test did not test concurrency"
    calls = result.report["calls"]
    assert sorted(c["index"] for c in calls) == list(range(12)) == sorted(per_call)
    # Every call's own findings (before the run merges repeats): exactly the half kernel's
    # defect, over that call's own array, and nothing on the scale kernel.
    for index, (name, x, (outputs, findings)) in per_call.items():
        rows = x.shape[0]
        if name == "half_kernel":
            assert [(f.kind.value, f.call_index, f.index_range) for f in findings] == [
                ("unwritten-output", index, ((4, rows), (0, 128)))]
            got = outputs[0].reshape(-1, 8, 128)
            np.testing.assert_array_equal(got[:, :4], x.reshape(-1, 8, 128)[:, :4])
        else:
            assert name == "scale_kernel" and findings == []
            np.testing.assert_array_equal(outputs[0], x * 3.0 + 1.0)
    summary = {c["index"]: (c["kernel"], c["findings"], c["grid"]) for c in calls}
    for index, (name, x, _) in per_call.items():
        assert summary[index] == (name, int(name == "half_kernel"), [x.shape[0] // 8])
    # The report merges the six occurrences into one finding of a half_kernel call.
    (finding,) = result.findings
    assert finding["kind"] == "unwritten-output" and finding["count"] == 6
    assert summary[finding["call_index"]][0] == "half_kernel"


# ---------------------------------------------------------------------------------------
# Memory stays bounded on long kernels.

STEPS = 2048


def _long_elementwise(x):
    return pl.pallas_call(
        _scale_kernel, grid=(x.shape[0] // 8,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def _sum_kernel(x_ref, o_ref):
    @pl.when(pl.program_id(0) == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += x_ref[...]


def _long_reduction(x):
    return pl.pallas_call(
        _sum_kernel, grid=(x.shape[0] // 8,),
        in_specs=[pl.BlockSpec((8, 128), lambda k: (k, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda k: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((8, 128), x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)))(x)


def _long_dma_loop(x):
    chunks = x.shape[0] // 8

    def kernel(x_hbm, o_ref, buf, sems):
        def copy(chunk, slot):
            return pltpu.make_async_copy(x_hbm.at[pl.ds(pl.multiple_of(chunk * 8, 8), 8), :],
                                         buf.at[slot], sems.at[slot])

        copy(0, 0).start()

        def body(i, carry):
            @pl.when(i + 1 < chunks)
            def _():
                copy(i + 1, (i + 1) % 2).start()

            copy(i, i % 2).wait()
            o_ref[...] += buf[i % 2]
            return carry

        o_ref[...] = jnp.zeros_like(o_ref)
        jax.lax.fori_loop(0, chunks, body, 0)

    return pl.pallas_call(
        kernel, grid=(1,), in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((8, 128), x.dtype),
        scratch_shapes=[pltpu.VMEM((2, 8, 128), jnp.float32), pltpu.SemaphoreType.DMA((2,))],
    )(x)


@pytest.mark.parametrize("fn, steps", [(_long_elementwise, STEPS), (_long_reduction, STEPS),
                                       (_long_dma_loop, STEPS // 4)],
                         ids=["elementwise", "reduction", "dma-loop"])
def test_race_history_stays_small_on_a_long_kernel(fn, steps, monkeypatch):
    """Every step touches a new block of the HBM arrays (which no later access covers);
    the race checker still keeps only a few records per buffer, and every buffer's
    written-shadow is exactly its own shape."""
    longest: dict[str, int] = {}
    states: list = []
    access = RaceChecker.on_access

    def measured(self, event):
        access(self, event)
        n = len(self.history[event.buffer_id]) if event.buffer_id in self.history else 0
        longest[event.buffer] = max(longest.get(event.buffer, 0), n)

    class RecordedState(simulate.CallState):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            states.append(self)

    monkeypatch.setattr(RaceChecker, "on_access", measured)
    monkeypatch.setattr(simulate, "CallState", RecordedState)
    x = (jnp.arange(steps * 8 * 128) % 5).astype(jnp.float32).reshape(steps * 8, 128)
    # The engine's race checker is what is measured (a long call would run compiled).
    session = Session(Config(races=True, dma_mode=DmaMode.ON_WAIT, tier=Tier.ENGINE))
    run_in(session, fn, x)
    assert session.findings == [] and session.engine_error is None
    assert longest and max(longest.values()) <= 80, longest
    (state,) = states
    (races,) = [x for x in state.feeds.listeners if isinstance(x, RaceChecker)]
    assert races.checked >= steps
    for buf in state.registry.values():
        assert buf.written.shape == buf.data.shape and buf.written.dtype == np.bool_, buf


def test_a_device_arriving_after_another_gave_up_does_not_use_its_operands():
    """Once a device stops waiting (its call failed), the meeting must never run with its
    operands; the devices' next call meets normally."""
    from pallas_check.engine.runtime.rendezvous import Rendezvous, RendezvousTimeout

    meeting_point = Rendezvous(timeout_s=0.05)
    ran = []
    with pytest.raises(RendezvousTimeout, match="device 0 waited"):
        meeting_point.meet(0, 2, ["device 0's operands"], ran.append)
    with pytest.raises(RendezvousTimeout, match="device 1 arrived after"):
        meeting_point.meet(1, 2, ["device 1's operands"], ran.append)
    assert ran == []
    # The next call of both devices meets normally, however late the second device comes
    # (the short limit above was for the device that was to wait in vain).
    meeting_point.timeout_s = 120
    result = {}
    worker = threading.Thread(target=lambda: result.setdefault(
        0, meeting_point.meet(0, 2, ["a0"], lambda ops: [o[0] * 2 for o in ops])))
    worker.start()
    assert meeting_point.meet(1, 2, ["a1"], lambda ops: [o[0] * 2 for o in ops]) == "a1a1"
    worker.join()
    assert result[0] == "a0a0"


@pytest.mark.parametrize("races", [False, True], ids=["races-off", "races-on"])
def test_a_call_allocates_its_output_and_shadow_but_never_copies_its_inputs(races):
    """Memory of a call is bounded by its outputs: inputs nobody writes are shared with
    the operands (copy on write) and keep no written-shadow; the output has its values
    and a one-byte-per-element shadow; the rest is block-sized."""
    import tracemalloc

    from pallas_check.engine.call.explore import run_call
    from pallas_check.intercept.patched_lowering import intercepted

    rows = 8 * 512
    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))

    def add(x, y):
        return pl.pallas_call(
            lambda x_ref, y_ref, o_ref: o_ref.__setitem__(..., x_ref[...] + y_ref[...]),
            grid=(rows // 8,), in_specs=[spec, spec], out_specs=spec,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)

    captured = {}

    def capture(params, operands, device, mesh_axes):
        captured["params"] = params
        return [np.zeros(a.shape, a.dtype) for a in params["out_avals"]]

    x = jnp.ones((rows, 128), jnp.float32)
    with intercepted(capture):
        jax.block_until_ready(jax.jit(add)(x, x))
    operands = [np.full((rows, 128), 2.0, np.float32), np.full((rows, 128), 3.0, np.float32)]
    for operand in operands:
        operand.flags.writeable = False  # as JAX hands them to the callback
    config = Config(races=races)
    run_call(captured["params"], operands, config, 0)  # compiles the kernel's segments
    tracemalloc.start()
    try:
        result = run_call(captured["params"], operands, config, 1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.findings == []
    np.testing.assert_array_equal(result.outputs[0], 5.0)
    output_bytes = operands[0].nbytes
    assert peak < output_bytes + output_bytes // 4 + 2**20, (peak, output_bytes)
