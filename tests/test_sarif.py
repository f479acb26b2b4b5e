"""SARIF 2.1.0 report (`--format sarif`): structure, rules, locations, fingerprints.

No network and nothing vendored: `validate_sarif` below checks the parts of the SARIF
2.1.0 schema a code-scanning page relies on (required properties, types, the property
names allowed on the objects we write, rule/result consistency, uriBaseIds).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pallas_check.exitcodes import ExitCode
from pallas_check.findings import Access, Finding, FindingKind, KernelInfo, SourceFrame
from pallas_check.report.model import RunReport
from pallas_check.report.sarif import FINGERPRINT, RULES, SRCROOT, report_sarif

ROOT = Path(__file__).resolve().parent.parent

# Properties SARIF 2.1.0 defines on the objects pallas-check writes (the schema sets
# additionalProperties false on most of them); "properties" is the open property bag.
ALLOWED = {
    "log": {"$schema", "version", "runs", "inlineExternalProperties", "properties"},
    "run": {"tool", "invocations", "conversion", "language", "versionControlProvenance",
            "originalUriBaseIds", "artifacts", "logicalLocations", "graphs", "results",
            "automationDetails", "runAggregates", "baselineGuid", "redactionTokens",
            "defaultEncoding", "defaultSourceLanguage", "newlineSequences", "columnKind",
            "externalPropertyFileReferences", "threadFlowLocations", "taxonomies",
            "addresses", "translations", "policies", "webRequests", "webResponses",
            "specialLocations", "properties"},
    "driver": {"name", "guid", "fullName", "semanticVersion", "version", "informationUri",
               "organization", "product", "rules", "notifications", "taxa", "language",
               "shortDescription", "fullDescription", "downloadUri", "releaseDateUtc",
               "dottedQuadFileVersion", "productSuite", "locations", "contents",
               "isComprehensive", "localizedDataSemanticVersion",
               "minimumRequiredLocalizedDataSemanticVersion", "associatedComponent",
               "translationMetadata", "supportedTaxonomies",
               "properties"},
    "rule": {"id", "deprecatedIds", "guid", "deprecatedGuids", "name", "deprecatedNames",
             "shortDescription", "fullDescription", "messageStrings",
             "defaultConfiguration", "helpUri", "help", "relationships", "properties"},
    "result": {"ruleId", "ruleIndex", "rule", "kind", "level", "message", "analysisTarget",
               "locations", "guid", "correlationGuid", "occurrenceCount",
               "partialFingerprints", "fingerprints", "stacks", "codeFlows", "graphs",
               "graphTraversals", "relatedLocations", "suppressions", "baselineState",
               "rank", "attachments", "hostedViewerUri", "workItemUris", "provenance",
               "fixes", "taxa", "webRequest", "webResponse", "properties"},
    "location": {"id", "physicalLocation", "logicalLocations", "message", "annotations",
                 "relationships", "properties"},
    "physical": {"address", "artifactLocation", "region", "contextRegion", "properties"},
    "artifact": {"uri", "uriBaseId", "index", "description", "properties"},
    "region": {"startLine", "startColumn", "endLine", "endColumn", "charOffset",
               "charLength", "byteOffset", "byteLength", "snippet", "message",
               "sourceLanguage", "properties"},
    "invocation": {"commandLine", "arguments", "responseFiles", "startTimeUtc",
                   "endTimeUtc", "exitCode", "ruleConfigurationOverrides",
                   "notificationConfigurationOverrides", "toolExecutionNotifications",
                   "toolConfigurationNotifications", "exitCodeDescription",
                   "exitSignalName", "exitSignalNumber", "processStartFailureMessage",
                   "executionSuccessful", "machine", "account", "processId",
                   "executableLocation", "workingDirectory", "environmentVariables",
                   "stdin", "stdout", "stderr", "stdoutStderr", "properties"},
}
LEVELS = {"none", "note", "warning", "error"}


def _keys(obj: dict, kind: str, where: str) -> None:
    assert isinstance(obj, dict), f"{where}: not an object"
    extra = set(obj) - ALLOWED[kind]
    assert not extra, f"{where}: properties SARIF does not define: {sorted(extra)}"


def _message(msg: dict, where: str) -> None:
    assert isinstance(msg, dict) and isinstance(msg.get("text"), str) and msg["text"], where


def _location(loc: dict, where: str, base_ids: dict) -> None:
    _keys(loc, "location", where)
    phys = loc["physicalLocation"]
    _keys(phys, "physical", where + ".physicalLocation")
    art = phys["artifactLocation"]
    _keys(art, "artifact", where + ".artifactLocation")
    assert isinstance(art["uri"], str) and art["uri"], where
    if "uriBaseId" in art:
        assert art["uriBaseId"] in base_ids, f"{where}: unknown uriBaseId"
        assert not art["uri"].startswith(("/", "file:")), f"{where}: not relative"
    else:
        assert art["uri"].startswith("file://"), f"{where}: relative uri without a base"
    if "region" in phys:
        region = phys["region"]
        _keys(region, "region", where + ".region")
        assert isinstance(region["startLine"], int) and region["startLine"] >= 1, where
        if "snippet" in region:
            assert isinstance(region["snippet"]["text"], str), where


def validate_sarif(log: dict) -> None:
    """Structural checks of a SARIF 2.1.0 log (raises AssertionError)."""
    _keys(log, "log", "log")
    assert log["version"] == "2.1.0"
    assert isinstance(log["$schema"], str) and log["$schema"].startswith("https://")
    assert isinstance(log["runs"], list) and len(log["runs"]) == 1
    run = log["runs"][0]
    _keys(run, "run", "run")
    driver = run["tool"]["driver"]
    _keys(driver, "driver", "driver")
    assert driver["name"] == "pallas-check" and isinstance(driver["version"], str)
    assert re.match(r"^[a-z][a-z0-9+.-]*://", driver["informationUri"])
    base_ids = run.get("originalUriBaseIds", {})
    for name, base in base_ids.items():
        assert base["uri"].startswith("file://") and base["uri"].endswith("/"), name
    rules = driver["rules"]
    ids = [r["id"] for r in rules]
    assert len(ids) == len(set(ids)), "rule ids must be unique"
    for i, rule in enumerate(rules):
        _keys(rule, "rule", f"rules[{i}]")
        assert isinstance(rule["id"], str) and rule["id"]
        _message(rule["shortDescription"], f"rules[{i}].shortDescription")
        _message(rule["help"], f"rules[{i}].help")
        assert rule["defaultConfiguration"]["level"] in LEVELS
    for i, inv in enumerate(run["invocations"]):
        _keys(inv, "invocation", f"invocations[{i}]")
        assert isinstance(inv["executionSuccessful"], bool)  # required by the schema
        for note in inv.get("toolExecutionNotifications", []):
            _message(note["message"], "notification")
            assert note["level"] in LEVELS
    assert isinstance(run["results"], list)
    for i, result in enumerate(run["results"]):
        where = f"results[{i}]"
        _keys(result, "result", where)
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
    """`pallas-check run SAMPLE --format sarif -o OUT` in a subprocess, from `cwd`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PALLAS_CHECK_")}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pallas_check", "run", sample, "--format", "sarif",
             "--output", str(out), *args],
            cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
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
                          "--dma", "on_wait")
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
                            "--dma", "on_wait")
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
