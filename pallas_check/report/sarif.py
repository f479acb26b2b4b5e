"""SARIF 2.1.0 report (`--format sarif`), for code-scanning pages (e.g. GitHub's).

One rule per finding kind; one result per finding, located at the user's source line, with
the other accesses of a race or an uninitialized read as related locations. Paths inside the
project are relative URIs against `%SRCROOT%`, the project root the table and text show
paths from (report/paths.py: the nearest pyproject.toml's folder above the script, else the
git root, else the current folder), so a report maps onto the repository from whatever
folder the run was started in; a file outside it is an absolute `file:///` URI. No
timestamps: the same run gives the same file, and each result's `partialFingerprints` stays
the same across runs and checkouts (`Finding.fingerprint`, findings/finding.py: it hashes the kind,
kernel, buffer, path relative to the project root and source text, not line numbers or
absolute paths), so a code-scanning page can tell a new alert from an old one. The rules'
text is the catalogue's (findings/kinds.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from pallas_check import __version__
from pallas_check.findings.finding import (Access, Finding, FindingKind, JsonObject, SourceFrame,
                                   format_range, project_uri)
from pallas_check.report.run_report import RunReport, Suppression
from pallas_check.report.paths import project_root

if TYPE_CHECKING:  # annotations only: a file's bytes do not depend on a display
    from pallas_check.config.display import Display

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
SRCROOT = "%SRCROOT%"
FINGERPRINT = "pallasCheck/v1"
_DEFAULT_URI = "https://pypi.org/project/pallas-check/"

def information_uri() -> str:
    """The project's home page from the installed metadata, else its PyPI page."""
    try:
        from importlib.metadata import metadata

        meta = metadata("pallas-check")
        urls: list[str] = meta.get_all("Project-URL") or []
        for entry in urls:
            label, _, url = entry.partition(",")
            if label.strip().lower() in ("homepage", "home", "source", "repository"):
                return url.strip()
        if "Home-page" in meta and meta["Home-page"]:
            return str(meta["Home-page"])
    except Exception:  # not installed as a distribution: the fallback is fine
        pass
    return _DEFAULT_URI


def root_uri(root: str) -> str:
    """`file:///path/to/root/`: a folder's URI ends in one slash (also for `/` itself)."""
    uri = Path(os.path.abspath(root)).resolve().as_uri()
    return uri if uri.endswith("/") else uri + "/"


def artifact_location(file: str, cwd: str | None = None) -> dict[str, str]:
    """A relative URI against %SRCROOT% (`cwd`, default the current folder) for a file
    inside it, else an absolute file URI."""
    uri, relative = project_uri(file, cwd)
    return {"uri": uri, "uriBaseId": SRCROOT} if relative else {"uri": uri}


def _physical(frame: SourceFrame, root: str) -> JsonObject:
    region: JsonObject = {"startLine": max(1, int(frame.line))}
    if frame.code:
        region["snippet"] = {"text": frame.code}
    return {"artifactLocation": artifact_location(frame.file, root), "region": region}


def _access_text(access: Access) -> str:
    grid = f" at grid point {tuple(access.grid_point)}" if access.grid_point is not None else ""
    actor = f" by {access.actor}" if access.actor else ""
    return f"{access.operation} {access.buffer}{format_range(access.index_range)}{actor}{grid}"


def _primary(finding: Finding, script: str, root: str) -> JsonObject:
    frame = finding.location
    if frame is None and finding.kernel.file:
        frame = SourceFrame(finding.kernel.file, finding.kernel.line or 1, finding.kernel.name)
    location: JsonObject
    if frame is not None:
        location = {"physicalLocation": _physical(frame, root)}
    else:
        location = {"physicalLocation": {"artifactLocation": artifact_location(script, root)}}
    location["logicalLocations"] = [{"name": finding.kernel.name, "kind": "function"}]
    return location


def _rule(kind: FindingKind) -> JsonObject:
    info = kind.info  # the catalogue's entry (findings/kinds.py)
    return {
        "id": kind.value,
        "name": info.sarif_name,
        "shortDescription": {"text": info.short},
        "fullDescription": {"text": info.short},
        "help": {"text": info.help, "markdown": info.help},
        "defaultConfiguration": {"level": info.severity},
        "properties": {"tags": ["correctness", "pallas", "tpu"], "precision": "high",
                       "problem.severity": info.severity},
    }


def _suppressions(why: Suppression) -> list[JsonObject]:
    """A suppressed result's `suppressions`: a comment in the code is `inSource`, a config
    entry or baseline file `external`; accepted, with what suppressed it."""
    return [{"kind": "inSource" if why.in_source else "external", "status": "accepted",
             "justification": f"pallas-check {why.describe()}",
             "properties": {"by": why.by, "where": why.where}}]


def _result(finding: Finding, index: dict[FindingKind, int], script: str,
            seen: dict[str, int], root: str) -> JsonObject:
    fp = finding.fingerprint(root)
    seen[fp] = seen.get(fp, 0) + 1
    if seen[fp] > 1:  # two findings alike but for their line: keep fingerprints unique
        fp = f"{fp}:{seen[fp]}"
    result: JsonObject = {
        "ruleId": finding.kind.value,
        "ruleIndex": index[finding.kind],
        "level": finding.kind.info.severity,
        # How to fix this one defect, where known: after the message, as a `help:` line
        # (a result has no help of its own, and `fixes` must carry edits).
        "message": {"text": finding.message + (f"\nhelp: {finding.help}" if finding.help
                                               else "")},
        "locations": [_primary(finding, script, root)],
        "partialFingerprints": {FINGERPRINT: fp},
        "occurrenceCount": max(1, int(finding.count)),
    }
    related: list[JsonObject] = [{"id": i, "physicalLocation": _physical(a.frames[0], root),
                "message": {"text": _access_text(a)}}
               for i, a in enumerate(finding.accesses, start=1) if a.frames]
    if related:
        result["relatedLocations"] = related
    props: JsonObject = {"kernel": finding.kernel.name, "callIndex": finding.call_index}
    if finding.buffer:
        props["buffer"] = finding.buffer + format_range(finding.index_range)
    if finding.memory_space:
        props["memorySpace"] = finding.memory_space
    if finding.grid_point is not None:
        props["gridPoint"] = list(finding.grid_point)
    if finding.actor:
        props["actor"] = finding.actor
    if finding.seed is not None:
        props["seed"] = finding.seed
    if finding.help:
        props["help"] = finding.help
    result["properties"] = props
    return result


def report_sarif(report: RunReport) -> JsonObject:
    """The report as a SARIF 2.1.0 log (one run)."""
    kinds = list(FindingKind)
    index = {kind: i for i, kind in enumerate(kinds)}
    seen: dict[str, int] = {}
    notifications: list[JsonObject] = []
    if report.user_error:
        notifications.append({"level": "error", "descriptor": {"id": "user-error"},
                               "message": {"text": f"the script failed: {report.user_error}"}})
    if report.internal_error:
        notifications.append({"level": "error", "descriptor": {"id": "internal-error"},
                              "message": {"text": report.internal_error}})
    invocation: JsonObject = {
        "executionSuccessful": not report.internal_error and not report.user_error,
        "exitCode": int(report.exit_code),
    }
    if notifications:
        invocation["toolExecutionNotifications"] = notifications
    root = str(project_root(report.script))  # the root the table and text show paths from
    run: JsonObject = {
        "tool": {"driver": {
            "name": "pallas-check",
            "version": __version__,
            "semanticVersion": __version__,
            "informationUri": information_uri(),
            "rules": [_rule(kind) for kind in kinds],
        }},
        "originalUriBaseIds": {SRCROOT: {"uri": root_uri(root)}},
        "invocations": [invocation],
        "results": [_result(f, index, report.script, seen, root) for f in report.findings]
        + [{**_result(f, index, report.script, seen, root),
            "suppressions": _suppressions(why)} for f, why in report.suppressed],
        "columnKind": "unicodeCodePoints",
        "properties": {"script": report.script, "config": report.config,
                       "partial": report.partial, "suppressed": len(report.suppressed)},
    }
    return {"$schema": SARIF_SCHEMA, "version": SARIF_VERSION, "runs": [run]}


class SarifReporter:
    def __init__(self, display: Display | None = None) -> None:
        pass  # a file's bytes do not depend on where they are shown

    def render(self, report: RunReport, stream: TextIO) -> None:
        json.dump(report_sarif(report), stream, indent=2, default=str)
        stream.write("\n")


def check_part(shown: str, text: str) -> None:
    """A script's report the hook is about to merge is SARIF of our version, else
    ValueError (or the JSON's own error), one line."""
    log = json.loads(text)
    if not isinstance(log, dict) or log.get("version") != SARIF_VERSION:
        raise ValueError(f"the report of {shown} is not SARIF {SARIF_VERSION}")


def merge_reports(parts: list[tuple[str, str]]) -> str:
    """The hook's report: one SARIF log whose runs are every script's, in order (the
    log's other keys are the first script's)."""
    logs = [json.loads(text) for _, text in parts]
    # JSON read back, dumped again as it is
    merged: dict[str, object] = dict(logs[0]) if logs else {"version": SARIF_VERSION, "runs": []}
    merged["runs"] = [run for log in logs for run in log.get("runs", [])]
    return json.dumps(merged, indent=2) + "\n"
