"""SARIF paths are relative to the project root, whatever folder the run starts in; files
pallas-check reads back (a baseline, the hook's per-script reports) are checked for their
schema version (issue 26, item 14)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pallas_check.cli.app import app
from pallas_check.config.exitcodes import ExitCode
from pallas_check.findings.finding import Finding, FindingKind, KernelInfo, SourceFrame
from pallas_check.report.run_report import RunReport
from pallas_check.report.sarif import FINGERPRINT, SRCROOT, report_sarif, root_uri

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "samples" / "dma_read_before_wait_bug.py"


def _finding(file: str) -> Finding:
    frame = SourceFrame(file, 25, "load_kernel", "y = buf[...] * 2.0")
    return Finding(FindingKind.UNINITIALIZED, "read of never-written memory",
                   KernelInfo("load_kernel", file, 19), 0, (0,), "core 0", "buf", "VMEM",
                   ((0, 8),), (frame,))


def _project(tmp_path: Path) -> tuple[Path, Path]:
    project = tmp_path / "proj"
    (project / "kernels").mkdir(parents=True)
    (project / "pyproject.toml").write_text('[project]\nname = "proj"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    return project, elsewhere


# -- SARIF %SRCROOT% ----------------------------------------------------------------------

def test_srcroot_is_the_pyproject_folder_not_the_current_one(tmp_path, monkeypatch):
    project, elsewhere = _project(tmp_path)
    monkeypatch.chdir(elsewhere)
    script = project / "kernels" / "k.py"
    report = RunReport(script=str(script), config={}, calls=[], exit_code=1,
                       findings=[_finding(str(script))])
    run = report_sarif(report)["runs"][0]
    assert run["originalUriBaseIds"] == {SRCROOT: {"uri": project.resolve().as_uri() + "/"}}
    location = run["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]
    assert location == {"uri": "kernels/k.py", "uriBaseId": SRCROOT}
    # The fingerprint is the same from the project's folder as from elsewhere.
    monkeypatch.chdir(project)
    again = report_sarif(RunReport(script="kernels/k.py", config={}, calls=[], exit_code=1,
                                   findings=[_finding(str(script))]))["runs"][0]
    assert (again["results"][0]["partialFingerprints"][FINGERPRINT]
            == run["results"][0]["partialFingerprints"][FINGERPRINT])
    assert again["originalUriBaseIds"] == run["originalUriBaseIds"]


def test_srcroot_without_pyproject_is_the_git_root(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "a" / "b").mkdir(parents=True)
    monkeypatch.chdir(repo / "a")
    script = repo / "a" / "b" / "k.py"
    run = report_sarif(RunReport(script=str(script), config={}, calls=[], exit_code=1,
                                 findings=[_finding(str(script))]))["runs"][0]
    assert run["originalUriBaseIds"][SRCROOT]["uri"] == repo.resolve().as_uri() + "/"
    location = run["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]
    assert location == {"uri": "a/b/k.py", "uriBaseId": SRCROOT}


def test_a_root_uri_is_never_file_colon_slash():
    """From `/` the old code wrote `file:/` (the trailing slash stripped, then one added)."""
    assert root_uri("/") == "file:///"
    assert root_uri("/tmp") == Path("/tmp").resolve().as_uri() + "/"


def test_sarif_of_a_real_run_started_from_another_folder(tmp_path):
    project, elsewhere = _project(tmp_path)
    script = project / "kernels" / "k.py"
    shutil.copy(SAMPLE, script)
    proc = subprocess.run([sys.executable, "-m", "pallas_check", "run", str(script),
                           "--no-races", "--format", "sarif", "-o", "out.sarif"],
                          cwd=elsewhere,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == ExitCode.FINDINGS, proc.stderr
    run = json.loads((elsewhere / "out.sarif").read_text())["runs"][0]
    assert run["originalUriBaseIds"] == {SRCROOT: {"uri": project.resolve().as_uri() + "/"}}
    (result,) = run["results"]
    physical = result["locations"][0]["physicalLocation"]
    assert physical["artifactLocation"] == {"uri": "kernels/k.py", "uriBaseId": SRCROOT}
    assert physical["region"]["startLine"] == 25
    related = result["relatedLocations"][0]["physicalLocation"]["artifactLocation"]
    assert related == {"uri": "kernels/k.py", "uriBaseId": SRCROOT}


# -- schema_version on read ------------------------------------------------------------------

@pytest.mark.parametrize("version, shown", [
    (2, "schema_version 2 is not supported"),
    ("1", "schema_version '1' is not supported"),
    (True, "schema_version True is not supported"),
    (None, "schema_version None is not supported"),
])
@pytest.mark.parametrize("update", [False, True])
def test_a_baseline_of_an_unknown_version_is_one_line_exit_2(tmp_path, monkeypatch,
                                                             version, shown, update):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "k.py").write_text("open('ran.txt', 'w').close()\n")
    data = {"schema": "pallas-check/baseline", "schema_version": version, "findings": []}
    (tmp_path / "b.json").write_text(json.dumps(data))
    before = (tmp_path / "b.json").read_text()
    args = ["run", "k.py", "--baseline", "b.json"] + (["--update-baseline"] if update else [])
    result = CliRunner().invoke(app, args)
    assert result.exit_code == ExitCode.USAGE, result.output
    assert result.output.strip() == (
        f"pallas-check: error: {tmp_path / 'b.json'}: baseline {shown}; this pallas-check"
        " reads schema_version 1")
    assert not (tmp_path / "ran.txt").exists()
    assert (tmp_path / "b.json").read_text() == before  # not overwritten by an update


def test_a_baseline_of_the_supported_version_is_read(tmp_path):
    from pallas_check.report.suppress import read_baseline

    path = tmp_path / "b.json"
    path.write_text(json.dumps({"schema": "pallas-check/baseline", "schema_version": 1,
                                "findings": [{"fingerprint": "ab"}]}))
    assert read_baseline(path) == [{"fingerprint": "ab"}]
    # One started by hand, without a version, is read as version 1.
    path.write_text(json.dumps({"schema": "pallas-check/baseline", "findings": []}))
    assert read_baseline(path) == []


@pytest.mark.parametrize("fmt, part, message", [
    ("json", {"schema": "pallas-check/report", "schema_version": 3},
     "the report of k.py: JSON report schema_version 3 is not supported; this pallas-check"
     " reads schema_version 2"),
    ("json", {"schema": "pallas-check/report", "schema_version": "2"},
     "JSON report schema_version '2' is not supported"),
    ("json", {"schema": "something/else", "schema_version": 2},
     "the report of k.py is not a pallas-check JSON report"),
    ("sarif", {"version": "2.0.0", "runs": []}, "the report of k.py is not SARIF 2.1.0"),
])
def test_the_hook_merges_only_reports_of_its_own_version(tmp_path, capsys, fmt, part,
                                                         message):
    from pallas_check.cli.hook import _write_merged

    part_file = tmp_path / "0.report"
    part_file.write_text(json.dumps(part))
    code = _write_merged(tmp_path / f"all.{fmt}", fmt, [("k.py", part_file)])
    assert code == ExitCode.USAGE
    err = capsys.readouterr().err.strip()
    assert err.startswith("pallas-check: error: cannot merge the scripts' reports: ")
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / f"all.{fmt}").exists()
