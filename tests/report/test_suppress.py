"""Suppressions and a baseline (report/suppress.py): inline by kind, bare, def-line, config (kernel
name and path glob), baseline (fingerprints, not lines), unused comments, every report
saying what was suppressed, SARIF `suppressions` valid against the schema, exit codes
counting only what is left; the hook and the pytest plugin honour them."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pallas_check.findings.finding import Access, CallSummary, Finding, FindingKind, KernelInfo, \
    SourceFrame
from pallas_check.report.run_report import RunReport
from pallas_check.report.sarif import report_sarif
from pallas_check.report.suppress import (Policy, SuppressionError, apply, function_span,
                                   make_policy, parse_rule)

from report.test_sarif import validate_sarif

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "samples"
SUPPRESSED = SAMPLES / "suppressed_findings.py"
_EXPECTED = re.compile(r"^Expected suppressed: kind=(\S+) buffer=(\S+) line=(\d+) by=(\S+)$",
                       re.MULTILINE)


def _line(finding: dict) -> int:
    return finding["frames"][0]["line"]


def test_each_inline_form_suppresses_its_finding(cli):
    """Inline by kind, bare `ignore` and the def-line, as the sample states them."""
    wanted = sorted(_EXPECTED.findall(SUPPRESSED.read_text()))
    assert len(wanted) == 3
    result = cli("run", str(SUPPRESSED))
    assert result.exit_code == 0, result.output
    report = result.report
    assert report["summary"]["findings"] == 0
    assert report["summary"]["suppressed"] == 3
    assert report["summary"]["suppressed_by"] == {"inline": 2, "def-line": 1}
    got = sorted((f["kind"], f["buffer"], str(_line(f)), f["suppressed"]["by"])
                 for f in report["findings"])
    assert got == wanted
    leak = next(f for f in report["findings"] if f["kind"] == "semaphore-leak")
    assert leak["suppressed"]["where"].endswith("suppressed_findings.py:35")  # the def line


def test_the_table_and_text_reports_say_what_was_suppressed(cli, tmp_path):
    table = cli("run", "--format", "table", str(SUPPRESSED), json_report=False)
    assert table.exit_code == 0
    assert "0 findings in 3 pallas_calls; 3 suppressed (inline 2, def-line 1)" in table.output
    text = cli("run", "--format", "text", str(SUPPRESSED), json_report=False)
    assert re.search(r"suppressed_findings\.py: suppressed: 3 findings \(inline 2,"
                     r" def-line 1\)$", text.output, re.MULTILINE), text.output
    sarif_file = tmp_path / "run.sarif"
    sarif = cli("run", "--format", "sarif", "-o", str(sarif_file), str(SUPPRESSED),
                json_report=False)
    assert sarif.exit_code == 0
    log = json.loads(sarif_file.read_text())
    validate_sarif(log)
    results = log["runs"][0]["results"]
    assert sorted(r["suppressions"][0]["properties"]["by"] for r in results) == [
        "def-line", "inline", "inline"]
    assert all(r["suppressions"][0]["kind"] == "inSource" for r in results)
    assert log["runs"][0]["invocations"][0]["exitCode"] == 0


def _copy(tmp_path: Path, name: str, edit=None) -> Path:
    target = tmp_path / name
    text = (SAMPLES / name).read_text()
    target.write_text(edit(text) if edit else text)
    return target


def test_a_comment_for_another_kind_suppresses_nothing(cli, tmp_path):
    """`ignore[race]` on the out-of-bounds line: the finding stays; with --no-races the
    comment is not called unused (the run did not look for races), with races (the
    default), it is."""
    script = _copy(tmp_path, "oob_load_bug.py", lambda t: t.replace(
        "x = x_ref[pl.ds(row, 8), :]", "x = x_ref[pl.ds(row, 8), :]  # pallas-check: ignore[race]"))
    result = cli("run", "--no-races", str(script))
    assert result.exit_code == 1
    assert [(f["kind"], _line(f), f["suppressed"]) for f in result.findings] == [
        ("out-of-bounds", 21, None)]
    with_races = cli("run", str(script))
    kinds = sorted((f["kind"], _line(f)) for f in with_races.findings)
    assert kinds == [("out-of-bounds", 21), ("unused-suppression", 21)]


def test_an_unknown_kind_is_reported(cli, tmp_path):
    script = _copy(tmp_path, "oob_load_bug.py", lambda t: t.replace(
        "x = x_ref[pl.ds(row, 8), :]", "x = x_ref[pl.ds(row, 8), :]  # pallas-check: ignore[oob]"))
    result = cli("run", str(script))
    unused = [f for f in result.findings if f["kind"] == "unused-suppression"]
    assert len(unused) == 1 and "names no finding kind (oob)" in unused[0]["message"]
    assert _line(unused[0]) == 21 and unused[0]["kernel"]["name"] == "scale_kernel"


def test_config_entries_by_kernel_name_and_path_glob(cli, tmp_path):
    by_name = cli("run", "--ignore", "out-of-bounds:scale_kernel",
                  str(SAMPLES / "oob_load_bug.py"))
    assert by_name.exit_code == 0
    (finding,) = by_name.findings
    assert finding["suppressed"] == {"by": "config", "where": "out-of-bounds:scale_kernel"}
    # The same kind in another kernel is not covered by that entry.
    other = cli("run", "--ignore", "out-of-bounds:other_kernel",
                str(SAMPLES / "oob_load_bug.py"))
    assert other.exit_code == 1
    vendor = tmp_path / "vendor"
    vendor.mkdir()
    script = shutil.copy(SAMPLES / "semaphore_leak_bug.py", vendor / "leak.py")
    (tmp_path / "pyproject.toml").write_text(
        '[tool.pallas-check]\nignore = ["race:ag_kernel", "semaphore-leak:*/vendor/*"]\n')
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        glob = cli("run", str(script))
    finally:
        os.chdir(cwd)
    assert glob.exit_code == 0, glob.output
    (finding,) = glob.findings
    assert finding["kind"] == "semaphore-leak"
    assert finding["suppressed"] == {"by": "config", "where": "semaphore-leak:*/vendor/*"}


def test_bad_config_entries_are_usage_errors(cli):
    for entry, says in (("racee:k", "unknown kind 'racee'"), ("race", "expected KIND:")):
        result = cli("run", "--ignore", entry, str(SAMPLES / "add_ok.py"))
        assert result.exit_code == 2 and result.report is None
        assert says in result.output


def _process(tmp_path: Path, *args: str):
    from scenarios.test_samples import _run_subprocess

    return _run_subprocess(Path(args[-1]), " ".join(args[:-1]))


def test_baseline_fails_only_on_new_findings(cli, tmp_path):
    """Written by --update-baseline (exit 0, deterministic); a re-run with it is clean even
    after lines moved; a new defect fails; another script's entries survive its update."""
    baseline = tmp_path / "pallas-check-baseline.json"
    script = _copy(tmp_path, "oob_load_bug.py")
    missing = cli("run", "--baseline", str(baseline), str(script))
    assert missing.exit_code == 2 and "baseline not found" in missing.output
    first = cli("run", "--baseline", str(baseline), "--update-baseline", str(script))
    assert first.exit_code == 0, first.output
    written = baseline.read_text()
    data = json.loads(written)
    assert data["schema"] == "pallas-check/baseline"
    (entry,) = data["findings"]
    assert entry["kind"] == "out-of-bounds" and entry["kernel"] == "scale_kernel"
    assert entry["file"] == "oob_load_bug.py" and entry["script"] == "oob_load_bug.py"
    assert entry["code"] == "x = x_ref[pl.ds(row, 8), :]"
    again = cli("run", "--baseline", str(baseline), "--update-baseline", str(script))
    assert again.exit_code == 0 and baseline.read_text() == written  # deterministic
    # Lines move (three blank lines above the kernel): the fingerprint does not.
    script.write_text(script.read_text().replace("\n\ndef scale_kernel", "\n\n\n\n\ndef scale_kernel"))
    # (A process of its own: this one caches the source lines it has shown.)
    moved = _process(tmp_path, "--baseline", str(baseline), str(script))
    assert moved.exit_code == 0, moved.output
    (finding,) = moved.findings
    assert _line(finding) == 24 and finding["suppressed"]["by"] == "baseline"
    # A new defect (a second out-of-bounds read on another line) is not in it.
    script.write_text(script.read_text().replace("o_ref[...] = 2.0 * x",
                                                 "o_ref[...] = 2.0 * x + x_ref[pl.ds(row + 8, 8), :]"))
    new = _process(tmp_path, "--baseline", str(baseline), str(script))
    assert new.exit_code == 1
    assert [f["suppressed"] is None for f in new.findings].count(True) == 1
    # Another script's update keeps this script's entry.
    leak = _copy(tmp_path, "semaphore_leak_bug.py")
    assert cli("run", "--baseline", str(baseline), "--update-baseline", str(leak)).exit_code == 0
    scripts = sorted(e["script"] for e in json.loads(baseline.read_text())["findings"])
    assert scripts == ["oob_load_bug.py", "semaphore_leak_bug.py"]


def test_update_baseline_keeps_a_link_a_link_and_needs_a_file(cli, tmp_path):
    real = tmp_path / "real.json"
    real.write_text('{"schema": "pallas-check/baseline", "findings": []}\n')
    link = tmp_path / "link.json"
    link.symlink_to(real)
    result = cli("run", "--baseline", str(link), "--update-baseline",
                 str(SAMPLES / "oob_load_bug.py"))
    assert result.exit_code == 0
    assert link.is_symlink() and len(json.loads(real.read_text())["findings"]) == 1
    alone = cli("run", "--update-baseline", str(SAMPLES / "add_ok.py"))
    assert alone.exit_code == 2 and "needs --baseline" in alone.output
    (tmp_path / "bad.json").write_text("[1, 2]")
    bad = cli("run", "--baseline", str(tmp_path / "bad.json"), str(SAMPLES / "add_ok.py"))
    assert bad.exit_code == 2 and "is not a pallas-check baseline" in bad.output
    script = SAMPLES / "add_ok.py"
    self_target = cli("run", "--baseline", str(script), "--update-baseline", str(script))
    assert self_target.exit_code == 2 and script.read_text().startswith('"""A correct')


def _finding(kind: FindingKind, line: int, file: str, kernel_line: int = 1,
             accesses: tuple = ()) -> Finding:
    return Finding(kind, "m", KernelInfo("k", file, kernel_line), 0,
                   frames=(SourceFrame(file, line, "k", "x"),), accesses=accesses)


def test_sarif_suppressions_are_valid_and_say_in_source_or_external(tmp_path):
    source = tmp_path / "k.py"
    source.write_text(textwrap.dedent("""\
        def k(x_ref):
            x_ref[0] = 1  # pallas-check: ignore[out-of-bounds]
            x_ref[1] = 2
            x_ref[2] = 3
        """))
    file = str(source)
    findings = [_finding(FindingKind.OUT_OF_BOUNDS, 2, file),
                _finding(FindingKind.RACE, 3, file), _finding(FindingKind.DEADLOCK, 4, file)]
    kept = apply(findings, [], Policy(rules=(parse_rule("race:k"),)))
    assert [f.kind for f in kept.active] == [FindingKind.DEADLOCK]
    report = RunReport(script=file, config={}, findings=kept.active, calls=[],
                       exit_code=1, suppressed=kept.suppressed)
    log = report_sarif(report)
    validate_sarif(log)
    results = log["runs"][0]["results"]
    assert "suppressions" not in results[0]
    assert [r["suppressions"][0]["kind"] for r in results[1:]] == ["inSource", "external"]
    assert results[1]["suppressions"][0]["status"] == "accepted"
    assert results[2]["suppressions"][0]["justification"] == "pallas-check config (race:k)"


def test_the_comment_may_sit_on_either_access_of_a_race_and_not_in_a_string(tmp_path):
    source = tmp_path / "k.py"
    source.write_text(textwrap.dedent("""\
        @decorated
        def k(x_ref):  # pallas-check: ignore[deadlock]
            s = "# pallas-check: ignore"
            x_ref[0] = 1
            x_ref[0] = 2  # pallas-check: ignore[race, deadlock]
        """))
    file = str(source)
    assert function_span(file, 1) == (2, 5)
    other = Access("write", "core 1", frames=(SourceFrame(file, 5, "k", ""),))
    race = _finding(FindingKind.RACE, 4, file, accesses=(other,))
    in_string = _finding(FindingKind.OUT_OF_BOUNDS, 3, file)
    deadlock = _finding(FindingKind.DEADLOCK, 4, file)  # the decorator line is kernel.line
    calls = [CallSummary(0, "k", file, 1, (1,), 0.0, 3)]
    kept = apply([race, in_string, deadlock], calls,
                 Policy(options=frozenset({"races"})))
    assert [(f.kind, why.by, why.where.rsplit(":", 1)[1]) for f, why in kept.suppressed] == [
        (FindingKind.RACE, "inline", "5"), (FindingKind.DEADLOCK, "def-line", "2")]
    assert kept.active == [in_string]  # both comments were used: nothing unused


def test_make_policy_errors():
    with pytest.raises(SuppressionError, match="needs --baseline"):
        make_policy(None, None, True, False)
    with pytest.raises(SuppressionError, match="unknown kind"):
        make_policy(["nope:k"], None, False, False)


def test_the_hook_honours_the_baseline_and_config(tmp_path):
    from cli.test_precommit import hook

    shutil.copy(SAMPLES / "oob_load_bug.py", tmp_path / "oob.py")
    shutil.copy(SAMPLES / "semaphore_leak_bug.py", tmp_path / "leak.py")
    (tmp_path / "pyproject.toml").write_text(textwrap.dedent("""\
        [tool.pallas-check]
        scripts = ["oob.py", "leak.py"]
        ignore = ["semaphore-leak:handshake_kernel"]
        baseline = "pallas-check-baseline.json"
        """))
    proc = subprocess.run([sys.executable, "-m", "pallas_check", "run", "oob.py",
                           "--update-baseline"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr
    assert "baseline of 1 finding written" in proc.stderr
    result = hook(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 suppressed (baseline 1)" in result.stdout
    assert "1 suppressed (config 1)" in result.stdout
    (tmp_path / "pallas-check-baseline.json").write_text(
        '{"schema": "pallas-check/baseline", "findings": []}\n')
    assert hook(tmp_path).returncode == 1


PLUGIN_SUITE = """\
import jax
import jax.numpy as jnp

import oob


def test_oob():
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    jax.block_until_ready(oob.scale(x))
"""


def test_the_pytest_plugin_honours_config_and_baseline(pytester, tmp_path):
    import api.test_pytest_plugin  # noqa: F401  (imports JAX's Pallas TPU module first)

    shutil.copy(SAMPLES / "oob_load_bug.py", pytester.path / "oob.py")
    pytester.makepyfile(test_oob=PLUGIN_SUITE)
    failing = pytester.runpytest("--pallas-check", "-p", "no:cacheprovider")
    failing.assert_outcomes(failed=1)
    (pytester.path / "pyproject.toml").write_text(
        '[tool.pallas-check]\nignore = ["out-of-bounds:scale_kernel"]\n')
    pytester.runpytest("--pallas-check", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    (pytester.path / "pyproject.toml").write_text(
        '[tool.pallas-check]\nbaseline = "b.json"\n')
    subprocess.run([sys.executable, "-m", "pallas_check", "run", "oob.py", "--baseline", "b.json",
                    "--update-baseline"], cwd=pytester.path, check=True, capture_output=True,
                   timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    pytester.runpytest("--pallas-check", "-p", "no:cacheprovider").assert_outcomes(passed=1)
