"""JSON report with a versioned schema (documented in docs/output.md, "JSON report")."""

from __future__ import annotations

import json
from collections import Counter
from typing import TYPE_CHECKING, TextIO

from pallas_check import __version__
from pallas_check.report.run_report import (RunReport, kernel_counts, replay_command,
                                       suppressed_counts, tier_counts)
from pallas_check.findings.finding import JsonObject
from pallas_check.report.schema import check_schema

if TYPE_CHECKING:  # annotations only: a file's bytes do not depend on a display
    from pallas_check.config.display import Display

SCHEMA = "pallas-check/report"
# 2: `findings` lists suppressed findings too, each with `suppressed` (null: it counts).
SCHEMA_VERSION = 2
# `pallas-check hook --output`: every script's report, in order, under `reports`.
HOOK_SCHEMA = "pallas-check/hook-report"
HOOK_SCHEMA_VERSION = 1


def header(schema: str, version: int, script: str) -> JsonObject:
    """The first keys of every JSON report (run, diff, native, compile): which report of
    which schema version, by which pallas-check, of which script."""
    return {"schema": schema, "schema_version": version,
            "tool": {"name": "pallas-check", "version": __version__}, "script": script}


def dump(data: JsonObject, stream: TextIO) -> None:
    """A JSON report as every command writes it: indented, one newline at the end."""
    json.dump(data, stream, indent=2, default=str)
    stream.write("\n")


def report_dict(report: RunReport) -> JsonObject:
    """The report as JSON-ready data; stable key order, no timestamps (reproducible)."""
    by_kind = Counter(f.kind.value for f in report.findings)
    return {
        **header(SCHEMA, SCHEMA_VERSION, report.script),
        "config": report.config,
        "exit_code": report.exit_code,
        "partial": report.partial,
        "user_error": report.user_error,
        "user_traceback": report.user_traceback,
        "internal_error": report.internal_error,
        "calls": [
            {"index": c.index, "kernel": c.kernel, "file": c.file, "line": c.line,
             "grid": list(c.grid), "findings": c.findings, "failed": c.failed,
             "interrupted": getattr(c, "interrupted", False),
             "progress": getattr(c, "progress", None) or None,
             # No compile times: the report stays byte-identical run to run.
             "compiled": {g: {k: v for k, v in entry.items() if k != "compile_seconds"}
                          for g, entry in getattr(c, "compiled", {}).items()},
             "races": getattr(c, "races", None) or None,
             # A note, not a finding: the kernel's memory no read or write touched.
             "unused_memory": [u.to_dict() for u in getattr(c, "unused_memory", ())],
             # Which way the call ran ("engine" or "compiled"), and why the engine where
             # the compiled tier did not run it ("" when there is nothing to say).
             "tier": getattr(c, "tier", "engine"), "reason": getattr(c, "tier_reason", ""),
             "call_site": None if c.call_site is None else
             {"file": c.call_site.file, "line": c.call_site.line,
              "function": c.call_site.function, "code": c.call_site.code}}
            for c in report.calls
        ],
        # Per kernel: calls checked, and calls --kernel / --calls passed through unchecked.
        "kernels": [{"kernel": name, "checked": checked, "passed_through": passed}
                    for name, checked, passed in kernel_counts(report)],
        "summary": {"findings": len(report.findings), "by_kind": dict(sorted(by_kind.items())),
                    "suppressed": len(report.suppressed),
                    "suppressed_by": suppressed_counts(report),
                    # Calls per tier, both keys always present.
                    "tiers": tier_counts(report)},
        "findings": [
            {**f.to_dict(), "replay": replay_command(report.script, report.config, f.seed,
                                                     report.rerun, report.script_args),
             "suppressed": None if why is None else {"by": why.by, "where": why.where}}
            for f, why in [*((f, None) for f in report.findings), *report.suppressed]
        ],
        "trace": report.trace,
        # What the run could not check, once each (e.g. the TPU compile without libtpu).
        "notes": list(report.notes),
        # Several --tpu generations: how each further one was traced (no times: the
        # report stays the same run to run).
        "traces": {g: {k: v for k, v in t.items() if k not in ("seconds", "process_seconds")}
                   for g, t in getattr(report, "traces", {}).items()},
    }


class JsonReporter:
    def __init__(self, display: Display | None = None) -> None:
        pass  # a file's bytes do not depend on where they are shown

    def render(self, report: RunReport, stream: TextIO) -> None:
        dump(report_dict(report), stream)


def check_part(shown: str, text: str) -> None:
    """A script's report the hook is about to merge is this pallas-check's JSON report (its
    schema and version), else ValueError (SchemaError, or the JSON's own error), one line."""
    check_schema(json.loads(text), f"the report of {shown}", SCHEMA, (SCHEMA_VERSION,),
                 "JSON report")


def merge_reports(parts: list[tuple[str, str]]) -> str:
    """The hook's report: every script's report, in order, under `reports`."""
    return json.dumps({"schema": HOOK_SCHEMA, "schema_version": HOOK_SCHEMA_VERSION,
                       "reports": [json.loads(text) for _, text in parts]}, indent=2) + "\n"
