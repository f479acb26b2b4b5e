"""`--output` never destroys anything, and the hook's report keeps every script (issue 15).

No test touches a real device file: FIFOs, symlinks and odd targets are made in tmp_path.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pallas_check.deliver.outfile import OutputError, check_target, write_report

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "samples"
MARKER_SCRIPT = """\
from pathlib import Path
Path(__file__).with_name("ran.txt").write_text("the script ran")
print("script output")
"""


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pallas_check", "run", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=300)


@pytest.fixture
def marker_script(tmp_path: Path) -> Path:
    script = tmp_path / "k.py"
    script.write_text(MARKER_SCRIPT)
    return script


def test_the_script_itself_is_refused_before_the_run(marker_script, tmp_path):
    before = marker_script.read_text()
    result = run(str(marker_script), "-o", str(marker_script), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"pallas-check: error: --output {marker_script} is the script itself; refusing to"
        " overwrite it"]
    assert marker_script.read_text() == before
    assert not (tmp_path / "ran.txt").exists()  # refused before anything ran


def test_a_symlink_to_the_script_is_refused_too(marker_script, tmp_path):
    link = tmp_path / "report.json"
    link.symlink_to(marker_script)
    result = run(str(marker_script), "-o", str(link), cwd=tmp_path)
    assert result.returncode == 2 and "is the script itself" in result.stderr


@pytest.mark.parametrize("make_target, message", [
    (lambda tmp: tmp, "is a folder, not a file"),
    (lambda tmp: tmp / "plain.txt" / "report.json", "Not a directory"),
])
def test_impossible_targets_are_usage_errors_before_the_run(marker_script, tmp_path,
                                                            make_target, message):
    (tmp_path / "plain.txt").write_text("x")
    target = make_target(tmp_path)
    result = run(str(marker_script), "-o", str(target), cwd=tmp_path)
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "ran.txt").exists()


def test_a_fifo_is_written_into_not_replaced(tmp_path):
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    received: list[str] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()))
    reader.start()
    result = run(str(SAMPLES / "oob_load_bug.py"), "--format", "json", "-o", str(fifo),
                 cwd=tmp_path)
    reader.join(timeout=60)
    assert result.returncode == 1, result.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # still a FIFO
    report = json.loads(received[0])
    assert [f["kind"] for f in report["findings"]] == ["out-of-bounds"]
    assert list(tmp_path.iterdir()) == [fifo]  # no temporary file left behind


def test_a_symlink_stays_a_link_and_its_target_gets_the_report(tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    target = reports / "latest.json"
    target.write_text("old report")
    target.chmod(0o640)
    link = tmp_path / "report.json"
    link.symlink_to(target)
    result = run(str(SAMPLES / "oob_load_bug.py"), "--format", "json", "-o", str(link),
                 cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert json.loads(target.read_text())["findings"][0]["kind"] == "out-of-bounds"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640  # the file keeps its mode
    assert sorted(p.name for p in reports.iterdir()) == ["latest.json"]


def test_dash_is_stdout(tmp_path):
    result = run(str(SAMPLES / "oob_load_bug.py"), "--format", "json", "-o", "-",
                 cwd=tmp_path)
    assert result.returncode == 1
    assert json.loads(result.stdout)["findings"][0]["kind"] == "out-of-bounds"
    assert not (tmp_path / "-").exists()


def test_json_on_stdout_parses_though_the_script_prints(tmp_path):
    result = run(str(SAMPLES / "oob_load_bug.py"), "--format", "json", cwd=tmp_path)
    json.loads(result.stdout)  # the script's print went to stderr
    assert "oob_load_bug: last row" in result.stderr


def test_a_report_that_cannot_be_written_at_the_end_goes_to_stdout(tmp_path, monkeypatch,
                                                                     capsys):
    from pallas_check.deliver import delivery

    def disk_full(path, text):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(delivery, "write_report", disk_full)
    written = delivery.deliver("the report\n", tmp_path / "r.txt", summary="1 finding",
                               shows_traceback=True, traceback_text=None, error=None)
    out, err = capsys.readouterr()
    assert written is False and out == "the report\n"
    assert "cannot write the report to" in err and "No space left on device" in err


def test_write_report_never_replaces_a_non_regular_file(tmp_path):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    reader = threading.Thread(target=lambda: fifo.read_text())
    reader.start()
    check_target(fifo)
    write_report(fifo, "text")
    reader.join(timeout=10)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    with pytest.raises(OutputError):
        check_target(tmp_path)


HOOK_TABLE = """\
[tool.pallas-check]
scripts = ["oob_load_bug.py", "semaphore_leak_bug.py"]
format = "{fmt}"
output = "reports/pallas-check.{ext}"
"""


@pytest.mark.parametrize("fmt, ext", [("sarif", "sarif"), ("json", "json")])
def test_the_hook_writes_one_report_with_every_script(tmp_path, fmt, ext):
    for name in ("oob_load_bug.py", "semaphore_leak_bug.py"):
        shutil.copy(SAMPLES / name, tmp_path / name)
    (tmp_path / "pyproject.toml").write_text(HOOK_TABLE.format(fmt=fmt, ext=ext))
    result = subprocess.run([sys.executable, "-m", "pallas_check", "hook"],
                            capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads((tmp_path / "reports" / f"pallas-check.{ext}").read_text())
    if fmt == "sarif":
        from report.test_sarif import _schema_validator

        _schema_validator().validate(report)  # the official SARIF 2.1.0 schema
        kinds = [r["ruleId"] for run_ in report["runs"] for r in run_["results"]]
        assert len(report["runs"]) == 2
    else:
        kinds = [f["kind"] for r in report["reports"] for f in r["findings"]]
        assert [r["script"] for r in report["reports"]] == ["oob_load_bug.py",
                                                            "semaphore_leak_bug.py"]
    assert sorted(kinds) == ["out-of-bounds", "semaphore-leak"]


def test_a_relative_output_is_where_it_was_asked_for_even_if_the_script_moves(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    script = tmp_path / "moves.py"
    script.write_text(f"import os\nos.chdir({str(elsewhere)!r})\n")
    result = run(str(script), "--format", "json", "-o", "report.json", cwd=tmp_path)
    assert result.returncode == 5, result.stderr  # no pallas_call in it
    assert json.loads((tmp_path / "report.json").read_text())["exit_code"] == 5
    assert not (elsewhere / "report.json").exists()
