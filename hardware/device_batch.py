"""On a TPU: many pallas-check commands in ONE process (the chip is opened once; each
process that opens it costs ~15 s), each kept as it ends.

Each argument is COMMAND:SCRIPT with COMMAND one of record, diff, native. A recording goes
to $OUT/rec/<script stem>.npz; every command's exit code, timing, stderr and JSON report
is appended as one line to $OUT/r/<name>.jsonl. A watchdog ends the process when one
command runs past LIMIT seconds (a kernel that hangs the chip), after writing `hung
SCRIPT` to the progress file; hardware/device_batch.sh then starts a new process with the
commands left.

Usage: python hardware/device_batch.py NAME LIMIT COMMAND:SCRIPT...
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path


def argv_for(command: str, script: str, report: Path, out: Path) -> list[str]:
    fmt = ["--format", "json", "-o", str(report)]
    if command == "record":
        return ["record", script, "-o", str(out / "rec" / (Path(script).stem + ".npz")),
                "--format", "json"]
    if command == "diff":
        return ["diff", script, "--native", *fmt]
    return ["run", script, "--native", *fmt]


def main() -> None:
    name, limit, jobs = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
    out = Path(os.environ.get("OUT", "hwout"))
    (out / "rec").mkdir(parents=True, exist_ok=True)
    (out / "r").mkdir(parents=True, exist_ok=True)
    progress = open(out / "r" / f"{name}.progress", "a")
    current: dict = {}

    def watchdog() -> None:
        while True:
            time.sleep(1)
            job, since = current.get("job"), current.get("since", 0.0)
            if job and time.monotonic() - since > limit:
                progress.write(f"hung {job}\n")
                progress.flush()
                os._exit(9)
    threading.Thread(target=watchdog, daemon=True).start()

    from typer.testing import CliRunner

    from pallas_check.cli.app import app

    with open(out / "r" / f"{name}.jsonl", "a") as log:
        for job in jobs:
            command, script = job.split(":", 1)
            report = Path(tempfile.mkdtemp()) / "report.json"
            argv = argv_for(command, script, report, out)
            progress.write(f"start {job}\n")
            progress.flush()
            current.update(job=job, since=time.monotonic())
            started = time.perf_counter()
            result = CliRunner().invoke(app, argv, catch_exceptions=True)
            current.update(job=None)
            entry: dict = {"job": job, "argv": argv, "exit": result.exit_code,
                           "seconds": round(time.perf_counter() - started, 2),
                           "stderr": result.stderr[-3000:], "stdout": result.stdout[-3000:]}
            if result.exception is not None and not isinstance(result.exception, SystemExit):
                entry["exception"] = "".join(
                    traceback.format_exception(result.exception))[-3000:]
            if report.exists():
                try:
                    entry["report"] = json.loads(report.read_text())
                except ValueError:
                    entry["report_text"] = report.read_text()[-3000:]
            log.write(json.dumps(entry, default=str) + "\n")
            log.flush()
            progress.write(f"done {job}\n")
            progress.flush()
            print(f"{job}: exit {entry['exit']} in {entry['seconds']} s", flush=True)


if __name__ == "__main__":
    main()
