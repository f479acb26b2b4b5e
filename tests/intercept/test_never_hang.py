"""Loops of calls finish, Ctrl-C always ends a run, a stuck call ends it too (issue 15).

The loop tests run a tiny kernel 200+ times, its output feeding the next JAX operation, in a
subprocess under a timeout: jitted, eager, vmapped and shard_mapped over two devices.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from pallas_check.engine.jaxpr.program import _segment_fns
from pallas_check.engine.runtime import progress
from pallas_check.process.watchdog import Watchdog

ROOT = Path(__file__).resolve().parents[2]
LOOP = ROOT / "tests" / "scripts" / "kernel_loop.py"


def run_checked(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pallas_check", "run", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


@pytest.mark.parametrize("mode, calls", [("jit", 300), ("eager", 200), ("vmap", 200)])
def test_a_loop_of_calls_finishes_with_the_right_value(mode, calls):
    result = run_checked(str(LOOP), "--", str(calls), mode)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"kernel_loop: {calls} {mode} calls, value {calls * 1e-3:.6f}" in result.stdout
    assert f"0 findings in {calls} pallas_calls" in result.stdout


def test_a_shard_mapped_loop_finishes_on_two_devices():
    # Each step is waited for: XLA's CPU runtime itself can stall a loop of multi-device
    # computations that runs far ahead of them under load (README, "Known limits").
    result = run_checked("--devices", "2", str(LOOP), "--", "200", "shard_map", "sync")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "kernel_loop: 200 shard_map calls, value 0.200000" in result.stdout
    assert "0 findings in 200 pallas_calls" in result.stdout


def test_eager_calls_reuse_the_compiled_segments_of_the_first():
    """An eager call traces a new jaxpr each time; its segments are compiled once."""
    from pallas_check.config import Config
    from pallas_check.intercept.session import Session

    sys.path.insert(0, str(ROOT / "tests" / "scripts"))
    try:
        import jax.numpy as jnp
        import kernel_loop
    finally:
        sys.path.pop(0)
    session = Session(Config())
    x = jnp.zeros((32, 128), jnp.float32)
    with session.install():
        x = kernel_loop.add(x, x + 1)
        compiled = len(_segment_fns)
        for _ in range(30):
            x = kernel_loop.add(x, x * 0 + 1)
    assert len(_segment_fns) == compiled
    assert float(x[0, 0]) == 31.0
    assert len(session.calls) == 31 and not session.findings


BLOCKED = """\
import threading
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, PartitionSpec as P
from kernel_loop import add

x = jnp.ones((16, 128))
print("checked", float(add(x, x)[0, 0]), flush=True)


def never_returns(v):
    print("stuck", flush=True)
    threading.Event().wait()
    return v


mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
stuck = jax.jit(jax.shard_map(
    lambda v: jax.pure_callback(never_returns, jax.ShapeDtypeStruct(v.shape, v.dtype), v),
    mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False))
stuck(x).block_until_ready()  # the main thread waits inside XLA, forever
"""


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # preexec_fn: SIGINT as a shell gives it
def test_ctrl_c_ends_a_run_blocked_inside_jax_with_a_partial_report(tmp_path):
    script = tmp_path / "blocked.py"
    script.write_text(BLOCKED)
    (tmp_path / "kernel_loop.py").write_text(LOOP.read_text())
    report = tmp_path / "report.json"
    process = subprocess.Popen(
        [sys.executable, "-m", "pallas_check", "run", "--devices", "2", str(script),
         "--format", "json", "-o", str(report)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert process.stdout.readline().startswith("checked 2.0")
        # Inside the stuck computation (each device's callback says so; the first will do).
        assert process.stdout.readline().startswith("stuck")
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 3, stderr
    data = json.loads(report.read_text())
    assert data["partial"] is True
    assert len(data["calls"]) == 1  # the call made before the script got stuck


def test_the_watchdog_stops_a_call_that_makes_no_progress():
    reasons: list[str] = []
    fired = threading.Event()

    def emergency(reason: str) -> bool:
        reasons.append(reason)
        fired.set()
        return False  # do not end the test process

    progress.beat()
    with Watchdog(emergency, calls_in_flight=lambda: 1, stall_s=0.5):
        assert fired.wait(timeout=120), "the watchdog never fired"
    assert len(reasons) == 1 and "no progress for" in reasons[0]


def test_the_watchdog_leaves_a_run_without_calls_in_flight_alone():
    """Not a second of sleep hoping the watchdog looked: it has looked twice at a run with
    no progress for longer than its stall limit, and let it be."""
    reasons: list[str] = []
    looked_stalled: list[float] = []
    looked_twice = threading.Event()

    def calls_in_flight() -> int:
        if progress.seconds_since_beat() >= 0.2:
            looked_stalled.append(progress.seconds_since_beat())
            if len(looked_stalled) >= 2:  # the first look's decision is made by now
                looked_twice.set()
        return 0

    progress.beat()
    with Watchdog(lambda r: reasons.append(r) or False, calls_in_flight=calls_in_flight,
                  stall_s=0.2):
        assert looked_twice.wait(timeout=120), "the watchdog never looked"
    assert reasons == []


OS_EXIT = """\
from kernel_loop import add
import os
import jax.numpy as jnp
x = jnp.zeros((32, 128))
add(x[:20], x[:20])  # 20 rows: the edge block reads padding; 4 rows never written
os._exit(0)
"""


def test_os_exit_after_a_finding_still_reports_it(tmp_path):
    """Not a silent pass: os._exit(0) skips every finally, but the report comes first."""
    script = tmp_path / "exits.py"
    script.write_text(textwrap.dedent(OS_EXIT))
    (tmp_path / "kernel_loop.py").write_text(LOOP.read_text())
    result = subprocess.run([sys.executable, "-m", "pallas_check", "run", str(script),
                             "--format", "json"], capture_output=True, text=True,
                            cwd=tmp_path, timeout=120)
    data = json.loads(result.stdout)
    kinds = {f["kind"] for f in data["findings"]}
    assert result.returncode == 1, result.stderr
    assert data["exit_code"] == 1 and len(data["calls"]) == 1
    assert kinds, data
