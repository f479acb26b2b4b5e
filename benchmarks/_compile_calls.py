"""Helper of benchmarks/compile.py, run in a fresh process: one case script with every call
simulated (as `run --compile` does, through the Python API), then each call compiled for
each generation, and per call and generation the compile's summary WITH its compile time
(which the run's JSON report leaves out to stay deterministic), printed as one JSON line.

    python benchmarks/_compile_calls.py CASE.py v5e,v6e,v7x DEVICES CORES
"""

from __future__ import annotations

import os
import sys

script, generations, devices, cores = sys.argv[1], sys.argv[2], int(sys.argv[3]), \
    int(sys.argv[4])
if devices > 1:
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"

import json  # noqa: E402
import runpy  # noqa: E402

import pallas_check  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
sys.argv = [script]
# Eager DMAs land in start order: the shipped all_gather relies on that order (its race
# under on_wait makes the case's own output check fail); only the compiles are measured.
# The Python API compiles every call after the block (as `run --compile`), and its
# CallSummary keeps each compile's time (the JSON report leaves it out).
with pallas_check.checking(compile=True, tpu=generations, cores=cores, dma="eager",
                           project=False) as run:
    runpy.run_path(script, run_name="__main__")
if run.report.internal_error:
    raise SystemExit(f"pallas-check failed: {run.report.internal_error}")
calls = [{"index": call.index, "kernel": call.kernel, "compiled": call.compiled}
         for call in run.calls]
if not calls or any(not call["compiled"] or any("compile_seconds" not in entry
                                                for entry in call["compiled"].values())
                    for call in calls):
    raise SystemExit(f"no per-call compile times in the Python API's report: {calls!r}")
print(json.dumps(calls))
