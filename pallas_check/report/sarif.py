"""SARIF 2.1.0 report (`--format sarif`), for code-scanning pages (e.g. GitHub's).

One rule per finding kind; one result per finding, located at the user's source line, with
the other accesses of a race or an uninitialized read as related locations. Paths inside the
project are relative URIs against `%SRCROOT%`, the project root the table and text show
paths from (report/paths.py: the nearest pyproject.toml's folder above the script, else the
git root, else the current folder), so a report maps onto the repository from whatever
folder the run was started in; a file outside it is an absolute `file:///` URI. No
timestamps: the same run gives the same file, and each result's `partialFingerprints` stays
the same across runs and checkouts (it hashes the kind, kernel, buffer, path relative to the
project root and source text, not line numbers or absolute paths), so a code-scanning page
can tell a new alert from an old one.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote

from pallas_check import __version__
from pallas_check.findings import Access, Finding, FindingKind, SourceFrame, format_range
from pallas_check.report.model import RunReport, Suppression
from pallas_check.report.paths import project_root

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
SRCROOT = "%SRCROOT%"
FINGERPRINT = "pallasCheck/v1"
_DEFAULT_URI = "https://pypi.org/project/pallas-check/"

# kind -> (name, short description, help)
RULES: dict[FindingKind, tuple[str, str, str]] = {
    FindingKind.OUT_OF_BOUNDS: (
        "OutOfBounds",
        "A load, store or DMA slice outside its ref, or a BlockSpec block outside its array.",
        "On a TPU an out-of-bounds access reads or overwrites unrelated memory without an"
        " error. Check the index arithmetic (pl.ds start and size, the BlockSpec index map)"
        " against the ref's shape; mask the edge with pl.when or a masked load/store."),
    FindingKind.UNINITIALIZED: (
        "UninitializedRead",
        "Output values depend on memory that was never written.",
        "The kernel read scratch, an output block or the padding of an edge block before"
        " writing it, and the value reached an output. Initialize the buffer (e.g. under"
        " pl.when(pl.program_id(k) == 0)), wait for the DMA that fills it before reading,"
        " or mask the padding away."),
    FindingKind.UNWRITTEN_OUTPUT: (
        "UnwrittenOutput",
        "Output elements the kernel never wrote.",
        "Those elements hold whatever the TPU's memory held. Make every grid step write its"
        " whole output block, or alias the output to an input (input_output_aliases) if"
        " keeping the old values is intended."),
    FindingKind.OUTPUT_REVISITED: (
        "OutputRevisited",
        "An output block is visited again after other blocks were written.",
        "The pipeline does not read an output block back: its first write-back is lost when"
        " the block comes round again. Order the grid so that the steps writing one output"
        " block are consecutive (reduction axes last, marked 'arbitrary')."),
    FindingKind.SEMAPHORE_LEAK: (
        "SemaphoreLeak",
        "A semaphore's count is not zero when the kernel ends.",
        "Every signal (or DMA completion) needs a matching wait before the kernel returns;"
        " a leftover count corrupts the next kernel that uses the semaphore."),
    FindingKind.DMA_NOT_WAITED: (
        "DmaNotWaited",
        "A DMA was started and never waited on.",
        "Without a wait the kernel can end, or read the destination, before the copy lands."
        " Call .wait() on the copy descriptor before using the destination and before the"
        " kernel returns."),
    FindingKind.RACE: (
        "DataRace",
        "Two accesses to overlapping memory, at least one a write, with no ordering between"
        " them.",
        "The accesses (listed as related locations) are not ordered by a DMA or semaphore"
        " wait, a barrier or the grid's sequential order, so the result depends on timing."
        " Add the missing wait, or give each actor its own buffer. Replay with the reported"
        " --seed."),
    FindingKind.DEADLOCK: (
        "Deadlock",
        "A wait that nothing can satisfy.",
        "On a TPU the kernel hangs. The related locations show who waits on which semaphore"
        " for what value; make sure every wait has a matching signal or DMA, on the right"
        " core and device."),
    FindingKind.UNUSED_SUPPRESSION: (
        "UnusedSuppression",
        "A `# pallas-check: ignore` comment that matched no finding in this run.",
        "The finding it was written for is gone (or it names a kind that does not exist):"
        " delete the comment, so that stale suppressions do not hide a future defect."),
    FindingKind.COMPILE_ERROR: (
        "TpuCompileError",
        "The TPU compiler rejects the kernel for this TPU generation.",
        "pallas-check compiled the call with libtpu for the named generation (--compile):"
        " the Pallas TPU lowering or Mosaic failed at the reported line. Typical causes: a"
        " block whose last two dimensions are not multiples of (8, 128), a primitive Mosaic"
        " cannot lower, a dynamic slice whose alignment cannot be proven. Without --compile,"
        " the simulation reports what it knows Mosaic never lowers (a ref indexed by an"
        " array of indices) and skips the call."),
    FindingKind.VMEM_EXCEEDED: (
        "VmemExceeded",
        "The kernel needs more VMEM (or SMEM) than this TPU generation has for it.",
        "Blocks (double-buffered), scratch and the compiler's own scratch together exceed"
        " the scoped VMEM limit or the chip's VMEM (or SMEM: scalar prefetch and SMEM"
        " scratch exceed the chip's). A call that fits no generation of --tpu is not"
        " simulated. Use smaller blocks, or raise the limit with"
        " pltpu.CompilerParams(vmem_limit_bytes=...) where the chip has room."),
    FindingKind.CHECK_FAILED: (
        "DebugCheckFailed",
        "The kernel's own assertion (pl.debug_check) failed.",
        "The condition the kernel's author asserted is false at the reported grid step(s)."
        " pallas-check evaluates every pl.debug_check, with or without"
        " pl.enable_debug_checks(); on a TPU the check runs only inside"
        " pl.enable_debug_checks() (and stops the kernel), otherwise it is compiled out and"
        " the kernel goes on with the state the author ruled out."),
}


def information_uri() -> str:
    """The project's home page from the installed metadata, else its PyPI page."""
    try:
        from importlib.metadata import metadata

        meta = metadata("pallas-check")
        for entry in meta.get_all("Project-URL") or []:
            label, _, url = entry.partition(",")
            if label.strip().lower() in ("homepage", "home", "source", "repository"):
                return url.strip()
        if meta.get("Home-page"):
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
    cwd = os.path.abspath(cwd or os.getcwd())
    absolute = os.path.abspath(file)
    try:
        rel = os.path.relpath(absolute, cwd)
    except ValueError:  # another drive
        rel = None
    if rel is not None and not rel.startswith(os.pardir):
        return {"uri": quote(Path(rel).as_posix()), "uriBaseId": SRCROOT}
    return {"uri": Path(absolute).as_uri()}


def _relative(file: str, root: str | None = None) -> str:
    return artifact_location(file, root)["uri"]


def _physical(frame: SourceFrame, root: str) -> dict[str, Any]:
    region: dict[str, Any] = {"startLine": max(1, int(frame.line))}
    if frame.code:
        region["snippet"] = {"text": frame.code}
    return {"artifactLocation": artifact_location(frame.file, root), "region": region}


def _access_text(access: Access) -> str:
    grid = f" at grid point {tuple(access.grid_point)}" if access.grid_point is not None else ""
    actor = f" by {access.actor}" if access.actor else ""
    return f"{access.operation} {access.buffer}{format_range(access.index_range)}{actor}{grid}"


def _primary(finding: Finding, script: str, root: str) -> dict[str, Any]:
    frame = finding.location
    if frame is None and finding.kernel.file:
        frame = SourceFrame(finding.kernel.file, finding.kernel.line or 1, finding.kernel.name)
    location: dict[str, Any]
    if frame is not None:
        location = {"physicalLocation": _physical(frame, root)}
    else:
        location = {"physicalLocation": {"artifactLocation": artifact_location(script, root)}}
    location["logicalLocations"] = [{"name": finding.kernel.name, "kind": "function"}]
    return location


def fingerprint(finding: Finding, root: str | None = None) -> str:
    """A hash that stays the same across runs and checkouts for the same defect (paths
    relative to `root`, default the current directory; a baseline passes its folder)."""
    def where(frames: tuple[SourceFrame, ...]) -> list[str]:
        if not frames:
            return []
        f = frames[0]
        return [_relative(f.file, root), f.function, f.code.strip() or str(f.line)]

    parts: list[Any] = [finding.kind.value, finding.kernel.name, finding.buffer,
                        finding.memory_space, where(finding.frames),
                        [[a.operation, a.buffer, where(a.frames)] for a in finding.accesses],
                        str(finding.details.get("merge", ""))]
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _rule(kind: FindingKind) -> dict[str, Any]:
    name, short, help_text = RULES[kind]
    return {
        "id": kind.value,
        "name": name,
        "shortDescription": {"text": short},
        "fullDescription": {"text": short},
        "help": {"text": help_text, "markdown": help_text},
        "defaultConfiguration": {"level": "error"},
        "properties": {"tags": ["correctness", "pallas", "tpu"], "precision": "high",
                       "problem.severity": "error"},
    }


def _suppressions(why: Suppression) -> list[dict[str, Any]]:
    """A suppressed result's `suppressions`: a comment in the code is `inSource`, a config
    entry or baseline file `external`; accepted, with what suppressed it."""
    return [{"kind": "inSource" if why.in_source else "external", "status": "accepted",
             "justification": f"pallas-check {why.describe()}",
             "properties": {"by": why.by, "where": why.where}}]


def _result(finding: Finding, index: dict[FindingKind, int], script: str,
            seen: dict[str, int], root: str) -> dict[str, Any]:
    fp = fingerprint(finding, root)
    seen[fp] = seen.get(fp, 0) + 1
    if seen[fp] > 1:  # two findings alike but for their line: keep fingerprints unique
        fp = f"{fp}:{seen[fp]}"
    result: dict[str, Any] = {
        "ruleId": finding.kind.value,
        "ruleIndex": index[finding.kind],
        "level": "error",
        "message": {"text": finding.message},
        "locations": [_primary(finding, script, root)],
        "partialFingerprints": {FINGERPRINT: fp},
        "occurrenceCount": max(1, int(finding.count)),
    }
    related = [{"id": i, "physicalLocation": _physical(a.frames[0], root),
                "message": {"text": _access_text(a)}}
               for i, a in enumerate(finding.accesses, start=1) if a.frames]
    if related:
        result["relatedLocations"] = related
    props: dict[str, Any] = {"kernel": finding.kernel.name, "callIndex": finding.call_index}
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
    result["properties"] = props
    return result


def report_sarif(report: RunReport) -> dict[str, Any]:
    """The report as a SARIF 2.1.0 log (one run)."""
    kinds = list(FindingKind)
    index = {kind: i for i, kind in enumerate(kinds)}
    seen: dict[str, int] = {}
    notifications = []
    if report.user_error:
        notifications.append({"level": "error", "descriptor": {"id": "user-error"},
                               "message": {"text": f"the script failed: {report.user_error}"}})
    if report.internal_error:
        notifications.append({"level": "error", "descriptor": {"id": "internal-error"},
                              "message": {"text": report.internal_error}})
    invocation: dict[str, Any] = {
        "executionSuccessful": not report.internal_error and not report.user_error,
        "exitCode": int(report.exit_code),
    }
    if notifications:
        invocation["toolExecutionNotifications"] = notifications
    root = str(project_root(report.script))  # the root the table and text show paths from
    run: dict[str, Any] = {
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
    def render(self, report: RunReport, stream: TextIO) -> None:
        json.dump(report_sarif(report), stream, indent=2, default=str)
        stream.write("\n")
