"""On a TPU: `pallas-check diff --native` (or another pallas-check command) on many sample
scripts in ONE process, so the chip is opened once (each process that opens it costs ~15 s).

Each run goes through typer's CliRunner as the test worker does (tests/_cli_worker.py); its
exit code, stderr and JSON report are appended as one line to `$OUT/<name>.jsonl` as soon as
it ends (a later hang or halt keeps what came before).

Usage: python hardware/device_diff.py NAME COMMAND SAMPLE... (COMMAND: diff, native)
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path


def one(command: str, sample: str) -> dict:
    from typer.testing import CliRunner

    from pallas_check.cli.app import app

    report = Path(tempfile.mkdtemp()) / "report.json"
    if command == "diff":
        argv = ["diff", sample, "--native", "--format", "json", "-o", str(report)]
    else:
        argv = ["run", sample, "--native", "--format", "json", "-o", str(report)]
    started = time.perf_counter()
    result = CliRunner().invoke(app, argv, catch_exceptions=True)
    entry: dict = {"sample": sample, "argv": argv, "exit": result.exit_code,
                   "seconds": round(time.perf_counter() - started, 2),
                   "stderr": result.stderr[-4000:], "stdout": result.stdout[-2000:]}
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        entry["exception"] = "".join(traceback.format_exception(result.exception))[-4000:]
    if report.exists():
        try:
            entry["report"] = json.loads(report.read_text())
        except ValueError:
            entry["report_text"] = report.read_text()[-4000:]
    return entry


def main() -> None:
    name, command, samples = sys.argv[1], sys.argv[2], sys.argv[3:]
    out = Path(os.environ.get("OUT", "hwout"))
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{name}.jsonl", "a") as f:
        for sample in samples:
            entry = one(command, sample)
            f.write(json.dumps(entry, default=str) + "\n")
            f.flush()
            print(f"{sample}: exit {entry['exit']} in {entry['seconds']} s", flush=True)


if __name__ == "__main__":
    main()
