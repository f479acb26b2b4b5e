"""Stopping a run loses nothing (issue 26): Ctrl-C, SIGTERM and the stall watchdog give a
partial report that lists the call the run stopped in, how far it got and the findings it
made until then; exit 3, one line on stderr, no temporary file left behind.

Real processes and real signals: each test starts `pallas-check run` and signals it (or
lets the watchdog stop it); reports are real files in tmp_path. No test waits for a time:
each signals once the run has printed that it reached the point the test is about, and a
run's own clocks (the watchdog's grace after a signal, its stall limit) are set so that a
loaded machine cannot change the outcome (issue 36, item 10).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pallas_check.config.exitcodes import ExitCode
from pallas_check.deliver.outfile import STALE_TEMP_S, TEMP_SUFFIX, write_report

ROOT = Path(__file__).resolve().parents[2]
LONG_RACE = ROOT / "tests" / "scripts" / "long_race.py"
RACE_LINE = 26  # long_race.py: copy.start(), the DMA whose write races with the read


# After a stop signal the watchdog ends a run whose main thread has not finished it within
# its grace (3 s): a run blocked inside JAX. The runs here are not blocked, and their
# report must be the main thread's however slowly a loaded machine unwinds them.
UNHURRIED = "import pallas_check.process.watchdog as w; w.GRACE_S = 600.0\n"

# `schedule N done` on stdout once the engine has counted the N-th schedule of a call as
# finished (what the report's `schedules_done` reads).
SAY_SCHEDULES = textwrap.dedent("""\
    from pallas_check.engine.runtime.inflight import InFlight
    schedule_done = InFlight.schedule_done
    def said(self, *args):
        schedule_done(self, *args)
        print(f"schedule {self.schedules_done} done", flush=True)
    InFlight.schedule_done = said
""")


def start(args: list[str], cwd: Path, setup: str = UNHURRIED) -> subprocess.Popen:
    """`pallas-check ARGS` in a new process, with Ctrl-C handled by default whatever the
    test runner's own disposition (a shell's background job ignores it); `setup` runs
    first, in the same process (patches the tests need)."""
    program = ("import signal, sys\n"
               "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
               f"{setup}\n"
               "sys.argv = ['pallas-check', *sys.argv[1:]]\n"
               "from pallas_check.cli.app import main; main()")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", program, *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(process: subprocess.Popen, line: str, timeout: float = 120) -> None:
    """Read the script's stdout until `line` (the call is being simulated)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = process.stdout.readline()
        if not got:
            raise AssertionError(f"the run ended before {line!r}: {process.stderr.read()}")
        if got.strip() == line:
            return
    raise AssertionError(f"no {line!r} within {timeout} s")


def finish(process: subprocess.Popen) -> tuple[int, str, str]:
    """Its exit code, the rest of its stdout, its stderr."""
    try:
        stdout, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    return process.returncode, stderr, stdout


@pytest.mark.parametrize("sig, name", [(signal.SIGINT, "Ctrl-C"), (signal.SIGTERM, "SIGTERM")],
                         ids=["SIGINT", "SIGTERM"])
def test_a_signal_in_a_long_racy_call_reports_the_call_and_its_races(tmp_path, sig, name):
    report = tmp_path / "report.json"
    process = start(["run", str(LONG_RACE), "--races", "--format", "json", "-o",
                     str(report), "--", "50000"], tmp_path)
    wait_for(process, "running")  # at grid step 2 of 50 000: steps 0 and 1 are done
    process.send_signal(sig)
    code, stderr, _ = finish(process)
    assert code == ExitCode.USER_ERROR, stderr
    data = json.loads(report.read_text())
    assert data["partial"] is True and data["exit_code"] == ExitCode.USER_ERROR
    assert data["user_error"] == f"interrupted ({name})" and data["internal_error"] is None
    [call] = data["calls"]
    assert call["kernel"] == "racy_kernel" and call["grid"] == [50000]
    assert call["interrupted"] is True and not call["failed"]
    done = call["progress"]["steps_done"]
    assert call["progress"] == {"steps_done": done, "steps_total": 50000}
    assert 2 <= done < 50000
    # Every step made its race until the stop (the step running then may have, too),
    # merged into one finding as in a finished run.
    [race] = data["findings"]
    assert (race["kind"], race["buffer"], race["frames"][0]["line"]) == ("race", "buf",
                                                                        RACE_LINE)
    assert done <= race["count"] <= done + 1
    assert call["findings"] == race["count"]
    assert data["summary"]["by_kind"] == {"race": 1}
    # One line on stderr: how and where the run stopped, and where the report is.
    assert stderr.splitlines() == [
        f"pallas-check: interrupted ({name}) in call 0 (racy_kernel) after {done} of 50000"
        f" grid steps; 1 finding in 1 pallas_call; report written to {report}"]
    # Nothing left beside the report (no temporary file of an interrupted write).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_an_interrupt_among_many_schedules_says_which_schedule(tmp_path):
    report = tmp_path / "report.json"
    process = start(["run", str(LONG_RACE), "--races", "--schedules", "500", "--keep-going",
                     "--format", "json", "-o", str(report), "--", "400"], tmp_path,
                    setup=UNHURRIED + SAY_SCHEDULES)
    wait_for(process, "schedule 1 done")
    wait_for(process, "running")  # grid step 2 of the second schedule's simulation
    process.send_signal(signal.SIGINT)
    code, stderr, _ = finish(process)
    assert code == ExitCode.USER_ERROR, stderr
    data = json.loads(report.read_text())
    [call] = data["calls"]
    progress = call["progress"]
    assert call["interrupted"] is True and progress["schedules_total"] == 500
    assert 1 <= progress["schedules_done"] < 500 and progress["steps_total"] == 400
    [race] = data["findings"]  # merged across schedules as usual: the first one's
    assert race["kind"] == "race" and race["count"] == 400 and race["seed"] == 0
    assert f"(schedule {progress['schedules_done'] + 1} of 500)" in stderr


BLOCKING_CALLBACK = """\
import threading
import jax, jax.numpy as jnp
from jax.experimental import pallas as pl


def wait_forever(i):
    print("callback waiting", flush=True)
    threading.Event().wait()


def kernel(x_ref, o_ref):
    jax.debug.callback(wait_forever, pl.program_id(0))
    o_ref[...] = x_ref[...] + 1.0


out = pl.pallas_call(kernel, grid=(2,), in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                     out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
                     out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32))(jnp.ones((16, 128)))
print("not reached", float(out[0, 0]))
"""


def test_ctrl_c_while_a_kernel_callback_blocks_is_the_users_interrupt(tmp_path):
    script = tmp_path / "blocking.py"
    script.write_text(BLOCKING_CALLBACK)
    report = tmp_path / "report.json"
    process = start(["run", str(script), "--format", "json", "-o", str(report)], tmp_path)
    wait_for(process, "callback waiting")  # inside the callback, in or before its wait
    process.send_signal(signal.SIGINT)
    code, stderr, _ = finish(process)
    assert code == ExitCode.USER_ERROR, stderr
    # One line: no KeyboardInterrupt traceback (JAX logs a callback's exception), no
    # flattened traceback of our frames as an internal error.
    assert stderr.splitlines() == [
        "pallas-check: interrupted (Ctrl-C) in call 0 (kernel) after 0 of 2 grid steps;"
        f" 0 findings in 1 pallas_call; report written to {report}"]
    data = json.loads(report.read_text())
    assert data["partial"] is True and data["internal_error"] is None
    assert data["user_error"] == "interrupted (Ctrl-C)"
    assert [(c["interrupted"], c["failed"]) for c in data["calls"]] == [(True, False)]


STUCK = """\
import threading
import jax, jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def never_returns():
    threading.Event().wait()


def kernel(x_hbm, o_ref, buf, sem):
    copy = pltpu.make_async_copy(x_hbm, buf, sem)
    copy.start()
    o_ref[...] = buf[...] * 2.0  # BUG: read before the wait
    copy.wait()

    @pl.when(pl.program_id(0) == 50)
    def _():
        jax.debug.callback(never_returns)


out = pl.pallas_call(
    kernel, grid=(100,), in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
    out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
    out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
    scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA],
)(jnp.ones((8, 128), jnp.float32))
"""


def test_the_stall_watchdog_reports_the_call_it_stops_with_its_findings(tmp_path):
    script = tmp_path / "stuck.py"
    script.write_text(STUCK)
    report = tmp_path / "report.json"
    # A 2 s stall limit, whose clock starts when the call reaches grid step 50 (where its
    # callback never returns): a slow start of the call on a loaded machine is no stall.
    setup = textwrap.dedent("""\
        import pallas_check.process.watchdog as w
        from pallas_check.engine.runtime import progress
        w.STALL_S = 2.0
        since_beat = progress.seconds_since_beat
        progress.seconds_since_beat = lambda: (
            since_beat() if any(s.done >= 50 for s in progress.live_calls()) else 0.0)
    """)
    process = start(["run", str(script), "--races", "--format", "json", "-o", str(report)],
                    tmp_path, setup=setup)
    code, stderr, _ = finish(process)
    assert code == ExitCode.USER_ERROR, stderr
    data = json.loads(report.read_text())
    assert data["partial"] is True
    assert data["user_error"] == "stopped: a pallas_call made no progress for 2 s (stuck)"
    [call] = data["calls"]
    assert call["interrupted"] is True
    assert call["progress"] == {"steps_done": 50, "steps_total": 100}
    [race] = data["findings"]  # steps 0..49, and step 50's before its callback
    assert race["kind"] == "race" and race["count"] == 51


def test_ctrl_c_while_jax_starts_stops_the_run_before_the_script(tmp_path):
    """A Ctrl-C while JAX starts used to land in one of JAX's garbage-collector callbacks,
    which Python ignores: the run went on to a full report."""
    script = tmp_path / "script.py"
    script.write_text("print('the script ran')\n")
    report = tmp_path / "report.json"
    setup = textwrap.dedent("""\
        import gc, os
        from pallas_check.tpu_compile import toolchain
        starting = toolchain.start_backends_quietly
        def interrupted_start(*args):
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C as JAX starts
            gc.collect()
            return starting(*args)
        toolchain.start_backends_quietly = interrupted_start
    """)
    process = start(["run", str(script), "--format", "json", "-o", str(report)], tmp_path,
                    setup=UNHURRIED + setup)
    code, stderr, stdout = finish(process)
    assert code == ExitCode.USER_ERROR, stderr
    assert "the script ran" not in stdout
    assert stderr.splitlines() == [
        f"pallas-check: interrupted (Ctrl-C); 0 findings in 0 pallas_calls;"
        f" report written to {report}"]
    data = json.loads(report.read_text())
    assert data["partial"] is True and data["calls"] == []


KILLED_MID_WRITE = """\
import os, signal, sys
from pathlib import Path
from pallas_check.deliver import outfile

report = Path(sys.argv[1])
outfile.write_report(report, "old report\\n")
def killed(*args):
    os.kill(os.getpid(), signal.SIGKILL)  # kill -9 between the write and the rename
outfile.os.replace = killed
outfile.write_report(report, "new report\\n")
"""


def test_a_kill_mid_write_keeps_the_old_report_and_the_next_run_cleans_up(tmp_path):
    report = tmp_path / "report.json"
    result = subprocess.run([sys.executable, "-c", KILLED_MID_WRITE, str(report)],
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert result.returncode == -signal.SIGKILL
    assert report.read_text() == "old report\n"
    [left] = [p for p in tmp_path.iterdir() if p != report]
    assert left.name.startswith(".report.json.") and left.name.endswith(TEMP_SUFFIX)
    assert left.read_text() == "new report\n"
    # Someone else's file and a young temporary file (another run still writing) stay.
    others = tmp_path / ".report.json.keep"
    others.write_text("not ours")
    young = tmp_path / f".report.json.young{TEMP_SUFFIX}"
    young.write_text("being written")
    old = time.time() - STALE_TEMP_S - 5
    os.utime(left, (old, old))
    os.utime(others, (old, old))
    write_report(report, "next report\n")
    assert report.read_text() == "next report\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [".report.json.keep", young.name, "report.json"])
