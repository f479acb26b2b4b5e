"""Helper of benchmarks/compile.py, run in a fresh process: one case script with every call
simulated and recorded (as `run --compile` does), then each call compiled for each
generation, and per call and generation the compile's summary WITH its compile time (which
the run's JSON report leaves out to stay deterministic), printed as one JSON line.

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

from pallas_check.config import Config, DmaMode, parse_generations  # noqa: E402
from pallas_check.session import Session  # noqa: E402
from pallas_check.tpu_compile.stage import compile_recorded  # noqa: E402
from pallas_check.tpu_compile.toolchain import start_backends_quietly  # noqa: E402

start_backends_quietly(compiling=True)
# Eager DMAs land in start order: the shipped all_gather relies on that order (its race
# under on_wait makes the case's own output check fail); only the compiles are measured.
session = Session(Config(compile=True, tpu=generations, devices=devices, cores=cores,
                         dma_mode=DmaMode.EAGER))
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
sys.argv = [script]
with session.install():
    runpy.run_path(script, run_name="__main__")
result = compile_recorded(session.compile_recorder.calls, parse_generations(generations))
print(json.dumps([{"index": call.index, "kernel": call.kernel.name,
                   "compiled": {g: o.summary() for g, o in result.by_call[call.index].items()}}
                  for call in sorted(session.compile_recorder.calls, key=lambda c: c.index)]))
