"""Issue 26's command-line trust items: streams stay streams, every error is one line, a
script that checks nothing is not green.

Streams and exit codes are checked in real subprocesses with real files and pipes (a shell
redirection, `pass_fds`), never a device file of the test machine itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pallas_check.config.exitcodes import ExitCode, worst

ROOT = Path(__file__).resolve().parents[2]
NO_CALL = "print('the script ran')\n"


def _pallas_check(*args: str, cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pallas_check", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300, **kwargs)


def _one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


# -- streams --------------------------------------------------------------------------------

@pytest.mark.parametrize("target", ["/dev/stdout", "/proc/self/fd/1"])
def test_a_report_to_stdout_appends_to_the_redirected_log(tmp_path, target):
    """`-o /dev/stdout >> log`: the log keeps its earlier lines and the script's prints;
    the report follows them (the file is written through, never replaced)."""
    script = tmp_path / "s.py"
    script.write_text(NO_CALL)
    log = tmp_path / "important.log"
    log.write_text("an earlier line\n")
    inode = log.stat().st_ino
    command = (f"{sys.executable} -m pallas_check run {script} --format json -o {target}"
               f" >> {log}")
    proc = subprocess.run(["sh", "-c", command], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == ExitCode.NO_CALLS, proc.stderr
    text = log.read_text()
    assert log.stat().st_ino == inode
    assert text.startswith("an earlier line\nthe script ran\n"), text
    report = json.loads(text[text.index("{"):])
    assert report["exit_code"] == ExitCode.NO_CALLS


def test_a_report_to_an_inherited_descriptor_goes_down_the_pipe(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(NO_CALL)
    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pallas_check", "run", str(script), "--format", "json",
             "-o", f"/dev/fd/{write_end}"], cwd=tmp_path, pass_fds=(write_end,),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        os.close(write_end)
        with os.fdopen(read_end, encoding="utf-8") as pipe:
            received = pipe.read()
        proc.wait(timeout=300)
    finally:
        for fd in (read_end, write_end):
            try:
                os.close(fd)
            except OSError:
                pass
    assert proc.returncode == ExitCode.NO_CALLS
    assert json.loads(received)["schema"] == "pallas-check/report"


def test_a_descriptor_that_is_not_open_is_a_usage_error(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(NO_CALL)
    proc = _pallas_check("run", str(script), "-o", "/dev/fd/97", cwd=tmp_path)
    assert proc.returncode == ExitCode.USAGE
    assert "descriptor 97 is not open" in _one_error_line(proc.stderr)


# -- one-line errors ------------------------------------------------------------------------

def test_a_script_name_the_system_refuses_is_one_line(tmp_path):
    proc = _pallas_check("run", "k" * 300 + ".py", cwd=tmp_path)
    assert proc.returncode == ExitCode.USAGE
    line = _one_error_line(proc.stderr)
    assert line.startswith("pallas-check: error: ") and "File name too long" in line
    assert len(line) < 160


def test_a_baseline_name_the_system_refuses_is_one_line(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(NO_CALL)
    proc = _pallas_check("run", str(script), "--baseline", "b" * 300 + ".json", cwd=tmp_path)
    assert proc.returncode == ExitCode.USAGE
    assert "File name too long" in _one_error_line(proc.stderr)


def test_an_absolute_hook_pattern_is_a_configuration_error(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.pallas-check]\npattern = ["/abs/*.py"]\n')
    proc = _pallas_check("hook", cwd=tmp_path)
    assert proc.returncode == ExitCode.USAGE
    line = _one_error_line(proc.stderr)
    assert "'/abs/*.py' is absolute" in line and "pyproject.toml" in line


def test_an_error_of_ours_outside_the_run_is_one_line_exit_4(cli, monkeypatch, tmp_path):
    """Any exception before the script runs (here: reading the settings) is ours."""
    import pallas_check.config.layers as settings

    def broken(*args, **kwargs):
        raise RuntimeError("settings exploded\nover two lines")

    monkeypatch.setattr(settings, "load_settings", broken)
    script = tmp_path / "s.py"
    script.write_text(NO_CALL)
    result = cli("run", str(script))
    assert result.exit_code == ExitCode.INTERNAL
    line = _one_error_line(result.output)
    assert line == ("pallas-check: error: internal error: RuntimeError: settings exploded"
                    " over two lines")


def test_bare_command_prints_the_help_on_lines_of_its_own(tmp_path):
    proc = _pallas_check(cwd=tmp_path)
    assert proc.returncode == ExitCode.USAGE  # as click does for a group without a command
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("Usage: ") and "Commands:" in lines
    assert "Traceback" not in proc.stderr


def test_dash_h_is_help(tmp_path):
    for args in (("-h",), ("run", "-h")):
        proc = _pallas_check(*args, cwd=tmp_path)
        assert proc.returncode == 0
        assert proc.stdout.startswith("Usage: pallas-check"), proc.stdout


# -- nothing checked ------------------------------------------------------------------------

def test_a_script_that_makes_no_pallas_call_exits_5(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(NO_CALL)
    proc = _pallas_check("run", str(script), cwd=tmp_path)
    assert proc.returncode == ExitCode.NO_CALLS == 5
    assert "no pallas_call was checked" in proc.stderr + proc.stdout


def test_the_hook_ranks_nothing_checked_below_findings_and_above_clean():
    assert worst([0, 5]) == ExitCode.NO_CALLS
    assert worst([5, 1]) == ExitCode.FINDINGS
    assert worst([5, 3, 1]) == ExitCode.USER_ERROR
    assert worst([]) == ExitCode.CLEAN


def test_the_hook_exits_5_when_its_scripts_check_nothing(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.pallas-check]\nscripts = ["s.py"]\n')
    (tmp_path / "s.py").write_text(NO_CALL)
    proc = _pallas_check("hook", cwd=tmp_path)
    assert proc.returncode == ExitCode.NO_CALLS
    assert "exit 5 (no pallas_call was checked)" in proc.stdout
