"""Where a run writes: two reports never share one file or stream, and a report path never
creates a chain of folders (issue 26, item 5).

Folders are made only under tmp_path; nothing is created at `/`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pallas_check.cli.app import app
from pallas_check.config.exitcodes import ExitCode
from pallas_check.deliver.outfile import OutputError, check_target, same_target, write_report

ROOT = Path(__file__).resolve().parents[2]
MARKER_SCRIPT = """\
from pathlib import Path
Path(__file__).with_name("ran.txt").write_text("the script ran")
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch) -> Path:
    (tmp_path / "k.py").write_text(MARKER_SCRIPT)
    monkeypatch.chdir(tmp_path)
    for name in ("PALLAS_CHECK_TRACE", "PALLAS_CHECK_OUTPUT", "PALLAS_CHECK_BASELINE"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def _refused(*args: str) -> str:
    """Run `pallas-check run k.py ARGS` in-process; it must be exit 2 with one line, before
    the script ran."""
    result = CliRunner().invoke(app, ["run", "k.py", *args])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == ExitCode.USAGE, result.output
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert not Path("ran.txt").exists()  # refused before the run
    return lines[0]


@pytest.mark.parametrize("args, first, second", [
    (["-o", "r.json", "--trace", "r.json"], "--output r.json", "--trace r.json"),
    (["-o", "r.json", "--baseline", "r.json", "--update-baseline"],
     "--output r.json", "--baseline r.json"),
    (["--trace", "t.json", "--baseline", "./t.json", "--update-baseline"],
     "--trace t.json", "--baseline t.json"),
    # A baseline only read is still overwritten by the report written after the run.
    (["-o", "b.json", "--baseline", "b.json"], "--output b.json", "--baseline b.json"),
])
def test_two_outputs_named_as_one_file_are_refused(project, args, first, second):
    (project / "b.json").write_text('{"schema": "pallas-check/baseline", "schema_version": 1,'
                                    ' "findings": []}')
    before = (project / "b.json").read_text()
    line = _refused(*args)
    assert line == (f"pallas-check: error: {first} and {second} are the same file: one"
                    " would overwrite the other")
    assert (project / "b.json").read_text() == before
    assert not (project / "r.json").exists() and not (project / "t.json").exists()


def test_a_symlink_to_the_same_file_is_the_same_file(project):
    (project / "report.json").write_text("old report")
    (project / "link.json").symlink_to(project / "report.json")
    line = _refused("-o", "report.json", "--trace", "link.json")
    assert "--output report.json and --trace link.json are the same file" in line
    assert (project / "report.json").read_text() == "old report"
    # A link into a folder, to a file that does not exist yet, resolves the same way.
    (project / "out").mkdir()
    (project / "alias").symlink_to(project / "out")
    line = _refused("-o", "out/new.json", "--trace", "alias/new.json")
    assert "are the same file" in line


def test_the_trace_from_the_environment_is_checked_the_same_way(project, monkeypatch):
    monkeypatch.setenv("PALLAS_CHECK_TRACE", "r.json")
    line = _refused("-o", "r.json")
    assert "--output r.json and --trace r.json are the same file" in line


def test_different_files_and_dev_null_twice_are_fine(tmp_path):
    assert not same_target(tmp_path / "a.json", tmp_path / "b.json")
    assert same_target(tmp_path / "a.json", tmp_path / "sub" / ".." / "a.json")
    assert not same_target("/dev/null", "/dev/null")  # discarding twice loses nothing
    hard = tmp_path / "hard.json"
    (tmp_path / "a.json").write_text("x")
    os.link(tmp_path / "a.json", hard)
    assert same_target(tmp_path / "a.json", hard)  # a hard link is the same file


def _pallas_check(*args: str, cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PALLAS_CHECK_TRACE", None)
    streams = kwargs or {"capture_output": True}
    return subprocess.run([sys.executable, "-m", "pallas_check", *args], cwd=cwd, env=env,
                          text=True, timeout=300, **streams)


@pytest.mark.parametrize("args, message", [
    # No --output: the report goes to stdout, so a trace there would be mixed into it.
    (["--trace", "/dev/stdout"], "the report (stdout) and --trace /dev/stdout are the same"
                                 " stream"),
    (["-o", "-", "--trace", "/dev/fd/1"], "--output - and --trace /dev/fd/1 are the same"
                                          " stream"),
    (["-o", "/dev/stdout", "--trace", "/proc/self/fd/1"],
     "--output /dev/stdout and --trace /proc/self/fd/1 are the same stream"),
    # stdout and stderr into one pipe (2>&1 |): one stream behind two descriptors.
    (["-o", "/dev/stdout", "--trace", "/dev/stderr"],
     "--output /dev/stdout and --trace /dev/stderr are the same stream"),
])
def test_two_reports_in_one_stream_are_refused(tmp_path, args, message):
    (tmp_path / "k.py").write_text(MARKER_SCRIPT)
    proc = _pallas_check("run", "k.py", *args, cwd=tmp_path, stderr=subprocess.STDOUT,
                         stdout=subprocess.PIPE)
    assert proc.returncode == ExitCode.USAGE, proc.stdout
    assert proc.stdout.strip() == f"pallas-check: error: {message}: two reports would be" \
                                  " interleaved in it"
    assert not (tmp_path / "ran.txt").exists()


def test_a_stream_redirected_into_the_trace_file_is_the_same_file(tmp_path):
    """`-o /dev/stdout > t.json --trace t.json`: the trace would replace the file the
    report is being written into."""
    (tmp_path / "k.py").write_text(MARKER_SCRIPT)
    with open(tmp_path / "t.json", "w") as log:
        proc = subprocess.run([sys.executable, "-m", "pallas_check", "run", "k.py", "-o",
                               "/dev/stdout", "--trace", "t.json"], cwd=tmp_path,
                              stdout=log, stderr=subprocess.PIPE, text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    assert "--output /dev/stdout and --trace t.json are the same stream" in proc.stderr


# -- folders --------------------------------------------------------------------------------

@pytest.mark.parametrize("flag", ["--output", "--trace", "--baseline"])
def test_a_chain_of_missing_folders_is_refused_and_nothing_is_created(project, flag):
    target = project / "absent" / "sub" / "t.json"
    extra = ["--update-baseline"] if flag == "--baseline" else []
    line = _refused(flag, str(target), *extra)
    assert line == (f"pallas-check: error: cannot create {flag} {target}:"
                    f" {project / 'absent'} does not exist (only the report's own folder"
                    " is created)")
    assert not (project / "absent").exists()


def test_the_trace_variable_with_missing_folders_is_refused(project, monkeypatch):
    """`PALLAS_CHECK_TRACE=/nonexistent/sub/t.json`, as root, made folders at `/`."""
    monkeypatch.setenv("PALLAS_CHECK_TRACE", str(project / "nonexistent" / "sub" / "t.json"))
    line = _refused()
    assert "cannot create --trace" in line and "does not exist" in line
    assert not (project / "nonexistent").exists()


def test_the_reports_own_folder_is_still_created(tmp_path):
    """`-o reports/run.json` in a fresh checkout: the one missing folder is made."""
    (tmp_path / "k.py").write_text(MARKER_SCRIPT)
    proc = _pallas_check("run", "k.py", "--format", "json", "-o", "reports/run.json",
                         cwd=tmp_path)
    assert proc.returncode == ExitCode.NO_CALLS, proc.stderr
    report = json.loads((tmp_path / "reports" / "run.json").read_text())
    assert report["schema"] == "pallas-check/report"


def test_write_report_creates_at_most_one_folder(tmp_path):
    with pytest.raises(OutputError, match="does not exist"):
        check_target(tmp_path / "a" / "b" / "t.json")
    with pytest.raises(FileNotFoundError):  # even if called without check_target
        write_report(tmp_path / "a" / "b" / "t.json", "text")
    assert not (tmp_path / "a").exists()
    write_report(tmp_path / "a" / "t.json", "text")
    assert (tmp_path / "a" / "t.json").read_text() == "text"


def test_the_hooks_report_with_missing_folders_is_refused_before_any_script(project,
                                                                            capsys):
    from pallas_check.cli.hook import run_hook

    (project / "pyproject.toml").write_text('[tool.pallas-check]\nscripts = ["k.py"]\n'
                                            'format = "json"\n'
                                            'output = "absent/sub/report.json"\n')
    assert run_hook() == ExitCode.USAGE
    err = capsys.readouterr().err.strip()
    assert err == (f"pallas-check: error: cannot create --output"
                   f" {project / 'absent' / 'sub' / 'report.json'}: {project / 'absent'}"
                   " does not exist (only the report's own folder is created)")
    assert not (project / "ran.txt").exists() and not (project / "absent").exists()
