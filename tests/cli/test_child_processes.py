"""Processes the script starts (issue 36, item 5): only the process that started the run
reports, handles signals and writes outputs; children never do, none is left running.

Real processes: `pallas-check run` on the scripts in tests/scripts/ (a pool with 'fork',
one with 'spawn', a forked child that calls a kernel, children blocked when the run is
stopped). Each script prints its children's pids on stderr ("children: ..."); after the
run, `ps` must show none of them running (gone, or a zombie nobody reaped yet). A child
left running would also hold the run's stdout: `communicate` would not return (its
timeout is only the safety net).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from pallas_check.config.exitcodes import ExitCode

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "scripts"
NOISE = ("Traceback", "KeyboardInterrupt", "internal error")


def _start(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "pallas_check", "run", *args], cwd=ROOT,
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _finish(process: subprocess.Popen) -> tuple[int, str, str]:
    try:
        stdout, stderr = process.communicate(timeout=180)
    finally:
        process.kill()
    return process.returncode, stdout, stderr


def _children(stderr: str) -> list[int]:
    [line] = [line for line in stderr.splitlines() if line.startswith("children:")]
    return [int(pid) for pid in line.split()[1:]]


def _running(pids: list[int]) -> list[str]:
    """`ps` lines of those of `pids` still running (a zombie is not)."""
    ps = subprocess.run(["ps", "-o", "pid=,stat=", "-p", ",".join(map(str, pids))],
                        capture_output=True, text=True, check=False)
    return [line for line in ps.stdout.splitlines() if line.split()[1:2] != ["Z"]]


def _quiet(stderr: str) -> None:
    for noise in NOISE:
        assert noise not in stderr, stderr


def test_a_fork_pool_and_a_forked_kernel_call_leave_one_report(tmp_path):
    """Pool workers write no report (three JSON objects; a worker's partial one replaced
    `-o`), their SIGTERM from the pool is no KeyboardInterrupt traceback and no second
    Ctrl-C of the run's (exit 3); a forked child's kernel is refused with one line, not a
    hang until the watchdog."""
    report = tmp_path / "report.json"
    code, stdout, stderr = _finish(_start([str(SCRIPTS / "fork_pool_and_child.py"),
                                           "--format", "json", "-o", str(report)]))
    assert code == ExitCode.FINDINGS, stderr
    data = json.loads(report.read_text())
    assert data["exit_code"] == ExitCode.FINDINGS and data["partial"] is False
    assert data["user_error"] is None and len(data["calls"]) == 1
    assert [f["kind"] for f in data["findings"]] == ["uninitialized"]
    assert stdout == "child exit: 1\n"  # the script's own print: the child failed
    pids = _children(stderr)
    refused = [line for line in stderr.splitlines() if "forked process" in line]
    assert refused == [f"pallas-check: the script's forked process {pids[-1]} failed:"
                       " ForkedProcessError: pallas-check: JAX cannot compile in a process"
                       " forked after JAX started (os.fork, or multiprocessing's 'fork'"
                       " start method): it would hang; start the process with"
                       " multiprocessing.get_context('spawn') (pallas-check checks its"
                       " pallas_calls too)"]
    _quiet(stderr)
    assert _running(pids) == []


def test_spawned_workers_calls_are_checked_and_reported_by_the_owner():
    """A 'spawn' worker's calls ran unintercepted ("Only interpret mode is supported on
    CPU backend"); now each is checked in the worker and listed in the owner's one report,
    after the owner's own call; stdout is that one JSON report."""
    code, stdout, stderr = _finish(_start([str(SCRIPTS / "spawn_pool.py"), "--format",
                                           "json", "--", "spawn"]))
    assert code == ExitCode.FINDINGS, stderr
    data = json.loads(stdout)  # one JSON object: nothing else on stdout
    assert [c["index"] for c in data["calls"]] == [0, 1, 2, 3, 4]
    assert {c["kernel"] for c in data["calls"]} == {"block_sum_kernel"}
    assert [c["findings"] for c in data["calls"]] == [1] * 5
    [finding] = data["findings"]
    assert (finding["kind"], finding["buffer"], finding["call_index"], finding["count"]) == (
        "uninitialized", "acc_ref", 0, 5)
    _quiet(stderr)
    assert _running(_children(stderr)) == []


def test_a_stopped_run_ends_the_children_the_script_left(tmp_path):
    """SIGTERM while a pool's workers and a forked child wait: the run's report says
    SIGTERM (once: a worker's signal no longer reaches the owner's watchdog), exit 3, no
    child prints a traceback, and none outlives the run."""
    report = tmp_path / "report.json"
    process = _start([str(SCRIPTS / "stopped_children.py"), "--format", "json", "-o",
                      str(report)])
    assert process.stdout.readline() == "ready\n"  # the children are started
    process.send_signal(signal.SIGTERM)
    code, _, stderr = _finish(process)
    assert code == ExitCode.USER_ERROR, stderr
    data = json.loads(report.read_text())
    assert data["partial"] is True and data["user_error"] == "interrupted (SIGTERM)"
    _quiet(stderr)
    assert _running(_children(stderr)) == []


def test_a_child_that_ignores_sigterm_is_killed():
    """`end_children`: SIGTERM, then SIGKILL for a child still running after the grace
    (a plain Python process: no JAX, no run)."""
    program = """if True:
        import os, signal, sys
        from pallas_check.process.children import end_children
        ready_r, ready_w = os.pipe()
        never_r, never_w = os.pipe()
        child = os.fork()
        if child == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            os.write(ready_w, b"x")
            os.read(never_r, 1)
            os._exit(0)
        os.read(ready_r, 1)  # the child ignores SIGTERM now
        end_children(grace_s=0.2)
        _, status = os.waitpid(child, 0)
        print(os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL)
    """
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert proc.stdout == "True\n", proc.stderr
