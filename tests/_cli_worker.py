"""Run `pallas-check ...` in a long-lived worker process instead of a fresh one per test.

A fresh `python -m pallas_check` pays Python + JAX start-up (~3 s) on every call. Tests that
only look at the exit code, the report/trace files and the printed text go through
`run_cli(argv, cwd=...)` instead: it hands the argv to a worker process (one per device
count per pytest process, started on first use, kept for later tests) that runs the CLI
in-process through typer's CliRunner, as the `cli` fixture in conftest.py does.

The device count is why there are several workers: `--devices N` works by putting
`--xla_force_host_platform_device_count=N` in XLA_FLAGS before JAX starts (cli/app.py's
`_set_device_count`), so a worker is started with that flag already set and JAX imported
once with N devices; later runs with the same `--devices N` pass the CLI's check that the
running JAX has N devices.

Protocol: one JSON line per request on the worker's stdin ({"argv", "cwd", "env"}: the
whole environment the run sees, as `subprocess.run(env=...)` takes it, or this process's
at the time of the request, as a subprocess inherits it), one
JSON line back ({"returncode", "stdout", "stderr"}) on a private copy of the worker's
original stdout (fd 1 itself is pointed at stderr, so stray prints can't corrupt it). A
request that takes longer than its timeout, or a worker that dies, fails the test with a
clear message and the worker is restarted for the next request. Workers end at exit.

`python tests/_cli_worker.py DEVICES` is the worker itself.
"""

from __future__ import annotations

import atexit
import io
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_DEVICE_FLAG = "--xla_force_host_platform_device_count"


@dataclass
class CliRun:
    """What `subprocess.run(..., capture_output=True, text=True)` gave the call sites."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str


class CliWorkerError(AssertionError):
    """The worker timed out or died: the test fails with this message."""


def device_count(argv: list[str]) -> int:
    """The `--devices N` (or `--devices=N`) of an argv; 1 when absent (the CLI's default)."""
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        if arg == "--devices" and i + 1 < len(argv):
            return int(argv[i + 1])
        if arg.startswith("--devices="):
            return int(arg.split("=", 1)[1])
    return 1


def _xla_flags(devices: int, current: str) -> str:
    """XLA_FLAGS as `_set_device_count` leaves them: any device-count flag replaced."""
    flags = [f for f in current.split() if not f.startswith(_DEVICE_FLAG)]
    if devices > 1:
        flags.append(f"{_DEVICE_FLAG}={devices}")
    return " ".join(flags)


class _Worker:
    """One worker process for one device count, and the pipe to it."""

    def __init__(self, devices: int) -> None:
        self.devices = devices
        env = dict(os.environ)
        env["XLA_FLAGS"] = _xla_flags(devices, env.get("XLA_FLAGS", ""))
        env.setdefault("JAX_PLATFORMS", "cpu")
        # Same pallas_check as the tests import (the subprocesses inherited PYTHONPATH).
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in [root, env.get("PYTHONPATH", "")] if p)
        self.log = tempfile.NamedTemporaryFile(prefix=f"cli-worker-{devices}-",
                                               suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [sys.executable, __file__, str(devices)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self.log, env=env, cwd=root)
        self.buffer = b""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self) -> str:
        try:
            return Path(self.log.name).read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def close(self) -> None:
        if self.alive():
            try:
                self.proc.stdin.close()  # type: ignore[union-attr]
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        try:
            os.unlink(self.log.name)
        except OSError:
            pass

    def request(self, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
        line = (json.dumps(payload) + "\n").encode()
        try:
            self.proc.stdin.write(line)  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
        except (BrokenPipeError, OSError) as exc:
            raise CliWorkerError(f"CLI worker ({self.devices} devices) died before the"
                                 f" request ({exc}):\n{self.log_tail()}") from None
        return json.loads(self._read_line(timeout))

    def _read_line(self, timeout: float) -> bytes:
        fd = self.proc.stdout.fileno()  # type: ignore[union-attr]
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CliWorkerError(
                    f"CLI worker ({self.devices} devices): no answer in {timeout:.0f} s;"
                    f" killed (restarted for the next test). Its log:\n{self.log_tail()}")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    self.proc.wait()
                    raise CliWorkerError(
                        f"CLI worker ({self.devices} devices) died (exit"
                        f" {self.proc.returncode}) during the run; restarted for the next"
                        f" test. Its log:\n{self.log_tail()}")
                self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line


_WORKERS: dict[int, _Worker] = {}
_LOCK = threading.Lock()  # one request at a time per pipe (a test may run from threads)


def run_cli(argv: list[str], cwd: str | Path | None = None,
            env: dict[str, str] | None = None, timeout: float = 300) -> CliRun:
    """`pallas-check *argv` in a worker with the argv's device count; cwd as given (else
    this process's), the environment `env` (else this process's) for the run only, but
    XLA_FLAGS stays the worker's (its JAX has started with it). Fails the test if it takes over
    `timeout` seconds or the worker dies (the worker is then replaced)."""
    with _LOCK:
        return _run_locked([str(a) for a in argv], cwd, env, timeout)


def _run_locked(argv: list[str], cwd: str | Path | None, env: dict[str, str] | None,
                timeout: float) -> CliRun:
    devices = device_count(argv)
    worker = _WORKERS.get(devices)
    if worker is None or not worker.alive():
        if worker is not None:
            worker.close()
        worker = _WORKERS[devices] = _Worker(devices)
    payload = {"argv": argv, "cwd": str(cwd or os.getcwd()),
               "env": dict(os.environ if env is None else env)}
    try:
        answer = worker.request(payload, timeout)
    except BaseException:
        worker.proc.kill()
        worker.close()
        del _WORKERS[devices]
        raise
    return CliRun(argv, answer["returncode"], answer["stdout"], answer["stderr"])


@atexit.register
def _close_workers() -> None:
    for worker in list(_WORKERS.values()):
        worker.close()
    _WORKERS.clear()


# ---- the worker side --------------------------------------------------------------------


def _serve_one(request: dict[str, Any]) -> dict[str, Any]:
    """One CLI run in this process, in the request's cwd and env, everything caught."""
    from typer.testing import CliRunner

    from pallas_check.cli.app import app

    saved_cwd, saved_env = os.getcwd(), dict(os.environ)
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ["XLA_FLAGS"] = saved_env.get("XLA_FLAGS", "")
    try:
        os.chdir(request["cwd"])
        result = CliRunner().invoke(app, request["argv"], catch_exceptions=True)
        stderr = result.stderr
        code = result.exit_code
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            stderr += "".join(traceback.format_exception(*result.exc_info))  # type: ignore
            code = 1
        return {"returncode": code, "stdout": result.stdout, "stderr": stderr}
    except BaseException:  # noqa: BLE001  (the worker reports, never dies of a run)
        return {"returncode": 1, "stdout": "", "stderr": traceback.format_exc()}
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


def _serve(devices: int) -> None:
    # The protocol gets its own copy of stdout; fd 1 then goes to stderr (the log).
    answers = io.TextIOWrapper(os.fdopen(os.dup(1), "wb"), encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), encoding="utf-8",
                                  line_buffering=True)
    os.environ["XLA_FLAGS"] = _xla_flags(devices, os.environ.get("XLA_FLAGS", ""))
    # As `python -m pallas_check` from the repository root: the root first on sys.path,
    # not tests/ (this file's folder).
    sys.path[0] = str(Path(__file__).resolve().parent.parent)
    import jax

    assert len(jax.devices()) == devices, (devices, jax.devices())
    import pallas_check.checkers  # noqa: F401  (paid once, not per request)
    import pallas_check.cli.app  # noqa: F401
    import pallas_check.engine.call.simulate  # noqa: F401

    for line in sys.stdin:
        if not line.strip():
            continue
        answers.write(json.dumps(_serve_one(json.loads(line))) + "\n")
        answers.flush()


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
