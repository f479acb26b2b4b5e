"""A long call shows its progress on a terminal (grid steps done / total, steps per second),
and nothing anywhere else (issue 26, item 13).

The terminal is a real pseudo-terminal (`pty`) as the child's stderr; pipes are pipes.
"""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
import textwrap
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from _pty import read_until_closed

import pallas_check
from pallas_check.engine.runtime import progress
from pallas_check.deliver.progress_line import describe, wanted

ROOT = Path(__file__).resolve().parents[2]
# Where no line must show: a call long enough for one to (1.5 s or more at 25 us a step,
# three times SHOW_AFTER_S).
STEPS = 60_000
# Where the line must show, the call is held at grid step 1 (`--hold`: a debug callback
# waits for a line on stdin) until the terminal shows the line: the test waits for the
# line, not for a time, and a short call does. (A kernel with a callback is simulated step
# by step, far slower a step than the plain one: short.)
HELD_STEPS = 2_000
LINE = b"grid steps"

LONG_CALL = textwrap.dedent("""\
    import sys

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import pallas as pl

    STEPS = int(sys.argv[1])


    def hold():  # until the test, having seen the progress line, sends a line
        sys.stdin.readline()


    def double_kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0


    def held_double_kernel(x_ref, o_ref):
        @pl.when(pl.program_id(0) == 1)
        def _():
            jax.debug.callback(hold)

        double_kernel(x_ref, o_ref)


    def doubling(kernel, steps):
        def double(x):
            return pl.pallas_call(
                kernel, grid=(steps,),
                in_specs=[pl.BlockSpec((8, 128), lambda i: (0, 0))],
                out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
                out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))(x)
        return double


    double = doubling(held_double_kernel if "--hold" in sys.argv else double_kernel, STEPS)
    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
    out = jax.jit(double)(x)
    np.testing.assert_allclose(np.asarray(out), 2.0 * np.asarray(x))
    print("output matches")
    """)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PALLAS_CHECK_", "NO_COLOR", "FORCE_COLOR", "COLUMNS"))
           or k == "PALLAS_CHECK_CACHE_DIR"}
    env.update(PYTHONPATH=str(ROOT), TERM="xterm-256color")
    return env


def _on_a_terminal(args: list[str], cwd: Path,
                   release: bytes | None = None) -> tuple[int, bytes, bytes]:
    """Run with stderr on a pseudo-terminal (200 columns) and stdout on a pipe: (exit code,
    stdout, everything the terminal received). `release`: once the terminal shows it, a
    line goes to the child's stdin (a held call goes on)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    proc = subprocess.Popen(args, cwd=cwd, env=_env(),
                            stdin=subprocess.PIPE if release else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)

    def answer(seen: bytes) -> None:
        if release and release in seen and not proc.stdin.closed:
            proc.stdin.write(b"go\n")
            proc.stdin.close()

    seen = read_until_closed(master, proc, on_output=answer)
    stdout = proc.stdout.read()
    proc.stdout.close()
    return proc.wait(timeout=60), stdout, seen


def _script(tmp_path: Path) -> Path:
    script = tmp_path / "long_call.py"
    script.write_text(LONG_CALL)
    return script


def test_a_long_call_shows_its_grid_steps_on_a_terminal(tmp_path):
    script = _script(tmp_path)
    code, stdout, terminal = _on_a_terminal(
        [sys.executable, "-m", "pallas_check", "run", str(script), "--", str(HELD_STEPS),
         "--hold"], tmp_path, release=LINE)
    assert code == 0, terminal.decode(errors="replace")
    text = terminal.decode(errors="replace")
    assert f"/{HELD_STEPS:,} grid steps" in text, text
    assert "pallas-check: call 0 held_double_kernel: " in text
    assert "steps/s" in text
    assert b"output matches" in stdout and b"0 findings in 1 pallas_call" in stdout


def test_no_progress_in_pipes_stderr_byte_for_byte(tmp_path):
    script = _script(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "pallas_check", "run", str(script), "--", str(STEPS)],
        cwd=tmp_path, env=_env(), capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == b""
    assert b"output matches" in proc.stdout


def test_no_progress_with_json_to_stdout_even_on_a_terminal(tmp_path):
    script = _script(tmp_path)
    code, stdout, terminal = _on_a_terminal(
        [sys.executable, "-m", "pallas_check", "run", str(script), "--format", "json", "--",
         str(STEPS)], tmp_path)
    assert code == 0
    assert b"grid steps" not in terminal and b"\x1b[" not in terminal
    assert b'"findings": []' in stdout


def test_the_python_api_shows_progress_only_when_asked(tmp_path):
    script = tmp_path / "api_progress.py"
    script.write_text(LONG_CALL.replace("out = jax.jit(double)(x)", textwrap.dedent(f"""\
        import pallas_check
        with pallas_check.checking(project=False):
            jax.block_until_ready(jax.jit(double)(x))
        print("MARK", file=sys.stderr, flush=True)
        with pallas_check.checking(project=False, progress=True):
            out = jax.jit(doubling(held_double_kernel, {HELD_STEPS}))(x)""")))
    code, _, terminal = _on_a_terminal([sys.executable, str(script), str(STEPS)], tmp_path,
                                       release=LINE)
    assert code == 0, terminal
    before, mark, after = terminal.partition(b"MARK")
    assert mark and b"grid steps" not in before
    assert f"/{HELD_STEPS:,} grid steps".encode() in after


def test_wanted_only_on_a_terminal_and_not_for_machine_formats_on_stdout():
    tty = SimpleNamespace(isatty=lambda: True)
    pipe = SimpleNamespace(isatty=lambda: False)
    assert wanted("table", None, tty) and wanted("text", "-", tty)
    assert not wanted("table", None, pipe)
    assert not wanted("json", None, tty) and not wanted("sarif", "-", tty)
    assert wanted("json", "report.json", tty)  # the report goes to a file


def test_describe_says_steps_total_rate_schedule_and_pass():
    steps = progress.GridSteps(3, "flash_kernel")
    steps.start(1_000_000)
    steps.done = 41_000
    line = describe(steps, (1, 20), steps.started + 2.0)
    assert line == ("pallas-check: call 3 flash_kernel: 41,000/1,000,000 grid steps (4%),"
                    " 20,500 steps/s, schedule 2/20")
    steps.start(1_000_000)
    assert describe(steps, None, steps.started).endswith(", pass 2")


def _grid_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1.0


def test_the_engine_counts_every_grid_step_of_every_pass(monkeypatch):
    """One add per grid step and core; the session drops the counter when the call ends."""
    seen = []
    real = progress.call_ended

    def ended(index):
        steps = progress._live.get(index)
        seen.append((steps.done, steps.total, steps.passes))
        real(index)

    monkeypatch.setattr(progress, "call_ended", ended)
    call = pl.pallas_call(_grid_kernel, grid=(3, 4),
                          in_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, j))],
                          out_specs=pl.BlockSpec((8, 128), lambda i, j: (i, j)),
                          out_shape=jax.ShapeDtypeStruct((24, 512), jnp.float32))
    x = jnp.zeros((24, 512), jnp.float32)
    with pallas_check.checking(project=False, cores=2) as run:
        out = jax.jit(call)(x)
    np.testing.assert_allclose(np.asarray(out), 1.0)
    assert run.findings == []
    assert seen == [(12, 12, 1)]
    assert progress.live_calls() == []
