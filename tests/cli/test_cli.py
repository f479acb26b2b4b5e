"""The `pallas-check` command line: options, exit codes, where output goes.

Each test writes the tiny script it needs into tmp_path. Most go through typer's CliRunner
(the `cli` fixture); a few run `python -m pallas_check` in a subprocess to see the real
stdout/stderr split and that no traceback of pallas-check's own reaches the user.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pallas_check import __version__
from pallas_check.cli.app import app
from pallas_check.config.exitcodes import ExitCode

ROOT = Path(__file__).resolve().parents[2]

PRELUDE = """\
import sys
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def half_kernel(x_ref, o_ref):
    o_ref[:4, :] = x_ref[:4, :]  # rows 4:8 of each block are never written


def half(x):
    return pl.pallas_call(
        half_kernel, grid=(x.shape[0] // 8,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


X = jnp.zeros((16, 128), jnp.float32)
"""


def write_script(tmp_path: Path, body: str, name: str = "script.py") -> Path:
    path = tmp_path / name
    path.write_text(PRELUDE + textwrap.dedent(body))
    return path


def line_of(path: Path, marker: str) -> int:
    """1-based line number of the first line of `path` containing `marker`."""
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if marker in line:
            return number
    raise AssertionError(f"{marker!r} not in {path}")


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def subprocess_run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "pallas_check", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def assert_no_traceback_of_ours(text: str) -> None:
    assert "pallas_check/" not in text and "pallas_check\\" not in text, text
    assert "EngineFailure" not in text, text


# -- usage -------------------------------------------------------------------------------


def test_version():
    result = invoke("--version")
    assert result.exit_code == ExitCode.CLEAN
    assert result.stdout.strip() == f"pallas-check {__version__}"


def test_missing_script_is_a_one_line_usage_error(tmp_path):
    missing = tmp_path / "nope.py"
    result = invoke("run", str(missing))
    assert result.exit_code == ExitCode.USAGE
    assert result.stderr.splitlines() == [f"pallas-check: error: script not found: {missing}"]
    assert result.stdout == ""


@pytest.mark.parametrize("args", [
    ["run", "--no-such-option", "x.py"],
    ["run", "--format", "xml", "x.py"],
    ["run", "--dma", "sometimes", "x.py"],
    ["run", "--devices", "0", "x.py"],
    ["no-such-command"],
])
def test_bad_command_lines_exit_2(tmp_path, args):
    script = write_script(tmp_path, "print('must not run')\n", name="x.py")
    args = [str(script) if a == "x.py" else a for a in args]
    result = invoke(*args)
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "must not run" not in result.output
    assert "Traceback" not in result.output


# -- the user's script ---------------------------------------------------------------------


def test_script_that_raises_is_the_users_failure(cli, tmp_path):
    script = write_script(tmp_path, """
        jax.block_until_ready(half(X))
        print("before the crash")
        raise ValueError("the user's own bug")  # CRASH
    """)
    result = cli("run", str(script))
    assert result.exit_code == ExitCode.USER_ERROR
    report = result.report
    assert report["exit_code"] == ExitCode.USER_ERROR
    assert report["user_error"] == "ValueError: the user's own bug"
    traceback = report["user_traceback"]
    assert f'File "{script}", line {line_of(script, "# CRASH")}, in <module>' in traceback
    assert "runpy" not in traceback
    assert_no_traceback_of_ours(traceback)
    # The finding made before the crash is still reported.
    assert [f["kind"] for f in result.findings] == ["unwritten-output"]
    assert report["partial"] is False
    # With the report in a file, the user's traceback goes to stderr, as Python's would.
    assert "ValueError: the user's own bug" in result.stderr
    assert "before the crash" in result.output


@pytest.mark.parametrize("exit_arg, expected", [
    ("0", ExitCode.NO_CALLS),  # ran to the end, but checked no pallas_call
    ("None", ExitCode.NO_CALLS),
    ("5", ExitCode.USER_ERROR),
    ("'fatal: bad input'", ExitCode.USER_ERROR),
])
def test_sys_exit(cli, tmp_path, exit_arg, expected):
    script = write_script(tmp_path, f"sys.exit({exit_arg})\nprint('not reached')\n")
    result = cli("run", str(script))
    assert result.exit_code == expected
    assert result.report["exit_code"] == expected
    assert "not reached" not in result.output
    if expected == ExitCode.USER_ERROR:
        assert result.report["user_error"] in ("the script exited with code 5",
                                               "fatal: bad input")


def test_findings_outrank_a_clean_exit(cli, tmp_path):
    script = write_script(tmp_path, "jax.block_until_ready(half(X))\nsys.exit(0)\n")
    result = cli("run", str(script))
    assert result.exit_code == ExitCode.FINDINGS


def test_script_args_after_double_dash_reach_sys_argv(tmp_path):
    script = write_script(tmp_path, """
        import json
        print("ARGV=" + json.dumps(sys.argv[1:]))
    """)
    out = tmp_path / "r.json"
    result = invoke("run", "--output", str(out), str(script), "--", "--format", "xml", "a b")
    assert result.exit_code == ExitCode.NO_CALLS, result.output
    assert 'ARGV=["--format", "xml", "a b"]' in result.stdout.splitlines()


def test_options_after_the_script_are_ours(tmp_path):
    """`run k.py --format json -- x`: --format is pallas-check's, x the script's."""
    script = write_script(tmp_path, """
        import json
        print("ARGV=" + json.dumps(sys.argv[1:]))
    """)
    out = tmp_path / "r.json"
    result = invoke("run", str(script), "--format", "json", "-o", str(out), "--", "x")
    assert result.exit_code == ExitCode.NO_CALLS, result.output
    assert result.stdout.splitlines() == ['ARGV=["x"]']
    assert json.loads(out.read_text())["exit_code"] == ExitCode.NO_CALLS
    # An option of the script's without `--` is a usage error, not silently passed on.
    result = invoke("run", str(script), "--its-flag")
    assert result.exit_code == ExitCode.USAGE
    assert "ARGV" not in result.output


def test_keyboard_interrupt_still_writes_a_partial_report(cli, tmp_path):
    script = write_script(tmp_path, """
        jax.block_until_ready(half(X))
        raise KeyboardInterrupt
        half(X)
    """)
    result = cli("run", str(script))
    assert result.exit_code == ExitCode.USER_ERROR
    assert result.report["partial"] is True
    assert [f["kind"] for f in result.findings] == ["unwritten-output"]
    assert len(result.report["calls"]) == 1


# -- pallas-check's own failures -----------------------------------------------------------


UNSUPPORTED = """
    def global_sem_kernel(x_ref, o_ref):
        sem = pl.get_global(pltpu.SemaphoreType.REGULAR)  # UNSUPPORTED
        pl.semaphore_signal(sem)
        pl.semaphore_wait(sem)
        o_ref[...] = x_ref[...]

    print("the user's print")
    try:
        out = pl.pallas_call(global_sem_kernel, grid=(1,),
                             out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))(X[:8])
        jax.block_until_ready(out)
    except Exception:
        print("the user swallowed the error")
"""


def test_unsupported_primitive_is_a_one_line_internal_error(tmp_path):
    """Exit 4, one line naming the primitive and the user's line; no traceback, even from
    JAX's own log of a failed callback, and even when the script catches the error."""
    script = write_script(tmp_path, UNSUPPORTED)
    proc = subprocess_run("run", str(script), cwd=tmp_path)
    assert proc.returncode == ExitCode.INTERNAL, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    (line,) = lines
    assert line.startswith("pallas-check: error: ")
    assert "'get_global'" in line
    assert f"{script}:{line_of(script, '# UNSUPPORTED')}" in line
    assert "Traceback" not in proc.stderr and "jax.io_callback failed" not in proc.stderr
    assert "the user's print" in proc.stdout


def test_unsupported_primitive_json_report(cli, tmp_path):
    script = write_script(tmp_path, UNSUPPORTED)
    result = cli("run", str(script))
    assert result.exit_code == ExitCode.INTERNAL
    error = result.report["internal_error"]
    assert "'get_global'" in error and "\n" not in error
    assert result.report["user_error"] is None and result.report["user_traceback"] is None


def test_engine_crash_inside_the_callback_is_exit_4(cli, tmp_path, monkeypatch):
    """Our bug in the engine, under jit: JAX wraps it in its own runtime error; the run
    still ends with our one-line message and exit 4, not as the user's failure."""
    from pallas_check.engine.call import explore

    def broken(*args, **kwargs):
        raise RuntimeError("simulated engine bug\nsecond line")

    monkeypatch.setattr(explore, "run_call_devices", broken)
    script = write_script(tmp_path, "jax.block_until_ready(jax.jit(half)(X))\n")
    result = cli("run", str(script))
    assert result.exit_code == ExitCode.INTERNAL
    error = result.report["internal_error"]
    assert "RuntimeError: simulated engine bug second line" in error
    assert result.stderr.splitlines()[-1] == f"pallas-check: error: {error}"
    assert result.report["user_error"] is None


def test_type_error_in_our_lowering_of_a_call_is_exit_4(cli, tmp_path, monkeypatch):
    """A TypeError raised while we lower an intercepted call (before any callback runs:
    it reaches the script as the jitted call's exception) is ours: exit 4 with our
    one-line message, never the user's error (issue 54: a key<pl> operand did this)."""
    from pallas_check.intercept import patched_lowering

    def broken(*args, **kwargs):
        raise TypeError("Cannot interpret 'injected' as a data type")

    monkeypatch.setattr(patched_lowering, "_host_call", broken)
    script = write_script(tmp_path, "jax.block_until_ready(jax.jit(half)(X))\n")
    result = cli("run", str(script))
    assert result.exit_code == ExitCode.INTERNAL
    error = result.report["internal_error"]
    assert error == ("internal error while intercepting a pallas_call: TypeError:"
                     " Cannot interpret 'injected' as a data type")
    assert result.stderr.splitlines()[-1] == f"pallas-check: error: {error}"
    assert result.report["user_error"] is None and result.report["user_traceback"] is None


def test_crash_outside_the_engine_but_in_our_callback_is_exit_4(cli, tmp_path, monkeypatch):
    """An exception raised by our handler before the engine runs is still ours."""
    from pallas_check.engine.call import describe

    def broken(params):
        raise KeyError("no such param")

    monkeypatch.setattr(describe, "kernel_info", broken)
    script = write_script(tmp_path, "jax.block_until_ready(half(X))\n")
    result = cli("run", str(script))
    assert result.exit_code == ExitCode.INTERNAL
    assert "KeyError" in result.report["internal_error"]
    assert result.report["user_error"] is None


# -- where the report goes -------------------------------------------------------------------


def test_output_file_is_written_atomically_and_not_printed(tmp_path):
    script = write_script(tmp_path, """
        print("hello from the script")
        jax.block_until_ready(half(X))
    """)
    out_dir = tmp_path / "reports"
    out = out_dir / "report.json"
    result = invoke("run", "--format", "json", "--output", str(out), str(script))
    assert result.exit_code == ExitCode.FINDINGS
    data = json.loads(out.read_text())
    assert data["summary"]["findings"] == 1
    assert out.read_text().endswith("}\n")
    assert sorted(p.name for p in out_dir.iterdir()) == ["report.json"]  # no temp file
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask
    assert result.stdout == "hello from the script\n"  # the report is not on stdout
    assert str(out) in result.stderr


def test_output_replaces_an_existing_report(tmp_path):
    script = write_script(tmp_path, "pass\n")
    out = tmp_path / "report.json"
    out.write_text("stale")
    result = invoke("run", "--format", "json", "-o", str(out), str(script))
    assert result.exit_code == ExitCode.NO_CALLS
    assert json.loads(out.read_text())["exit_code"] == ExitCode.NO_CALLS


def test_subprocess_streams_json_on_stdout_and_errors_on_stderr(tmp_path):
    script = write_script(tmp_path, """
        jax.block_until_ready(half(X))
        raise ValueError("user bug")  # CRASH
    """)
    proc = subprocess_run("run", "--format", "json", str(script), cwd=tmp_path)
    assert proc.returncode == ExitCode.USER_ERROR
    report = json.loads(proc.stdout)  # stdout is the JSON report and nothing else
    assert report["findings"][0]["kind"] == "unwritten-output"
    # stderr has the user's traceback, pointing at the user's line, none of our frames.
    assert f'File "{script}", line {line_of(script, "# CRASH")}' in proc.stderr
    assert proc.stderr.rstrip().endswith("ValueError: user bug")
    assert_no_traceback_of_ours(proc.stderr)
    assert "runpy" not in proc.stderr


def test_subprocess_version_and_usage_error(tmp_path):
    proc = subprocess_run("--version", cwd=tmp_path)
    assert (proc.returncode, proc.stdout.strip()) == (0, f"pallas-check {__version__}")
    proc = subprocess_run("run", "missing.py", cwd=tmp_path)
    assert proc.returncode == ExitCode.USAGE
    assert proc.stderr == "pallas-check: error: script not found: missing.py\n"
    assert proc.stdout == ""
