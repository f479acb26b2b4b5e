"""The chip's compile in its worker process (tpu_compile/remote.py) against in pallas-check's
own process: what the worker costs.

    python benchmarks/compile_worker.py                 # 3 rounds
    python benchmarks/compile_worker.py --rounds 5 --json worker.json

Each round, each mode, each case runs in a fresh process with the outcome cache off
(`PALLAS_CHECK_CACHE_DIR=off`: every call compiled): the case script of
`tests/shipped_kernels/` under `pallas_check.checking(compile=True, tpu="v5e")`, and each
call's compile time for v5e from the Python API's call summaries (`compile_seconds`: the
lowering, the export and the worker's answer, or the lowering and the compile here). Call 0
of a process is the cold compile (libtpu's compiler starting; in the worker mode the
worker's start too), the later calls warm. Modes: `worker` (the default) and `in-process`
(`remote.enabled = False`, as before the worker); each call's scoped VMEM (the compiled
kernels' own figure) compared between the two. Also: the worker's start alone (a fresh
process sends its first job, one the worker cannot load: the answer comes once the worker
has started, imported JAX and Pallas and made the v5e topology).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "tests" / "shipped_kernels"
CHILD = r"""
import json, os, runpy, sys, time
import pallas_check
from pallas_check.tpu_compile import remote
remote.enabled = sys.argv[2] == "worker"
script = sys.argv[1]
sys.path.insert(0, os.path.dirname(script))
sys.argv = [script]
with pallas_check.checking(compile=True, tpu="v5e", chip_compile=False, dma="eager",
                           chip_arithmetic=False,
                           project=False) as run:
    try:  # (only the compiles are measured: a case's own check may fail under dma="eager")
        runpy.run_path(script, run_name="__main__")
    except AssertionError:
        pass
print(json.dumps({"seconds": [call.compiled["v5e"]["compile_seconds"] for call in run.calls],
                  "scoped": [call.compiled["v5e"]["vmem_scoped_bytes"] for call in run.calls],
                  "workers": remote.workers_started()}))
"""
START = r"""
import time
from pallas_check.tpu_compile import remote, toolchain
toolchain.quiet_environment(compiling=True)
started = time.perf_counter()
try:
    remote.compile_in_worker(remote.Job(b"not an export", "v5e:2x2"))
except remote.Unavailable:
    pass
print(time.perf_counter() - started)
"""


def _child(code: str, *args: str) -> str:
    env = dict(os.environ, PALLAS_CHECK_CACHE_DIR="off",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, check=False)
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {done.stderr[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cases", default="example_kernel,paged_attention")
    parser.add_argument("--json", type=Path)
    options = parser.parse_args()
    results: dict[str, list[object]] = {}
    for _ in range(options.rounds):
        results.setdefault("worker start", []).append(float(_child(START)))
        for case in options.cases.split(","):
            for mode in ("in-process", "worker"):
                found = json.loads(_child(CHILD, str(CASES / f"case_{case}.py"), mode))
                results.setdefault(f"{case} {mode}", []).append(found)
    print("| what | cold (call 0) | warm (later calls) | workers started | scoped VMEM as"
          " in-process |")
    print("|---|---:|---:|---:|---|")
    for name, runs in results.items():
        if name == "worker start":
            print(f"| the worker's start | {statistics.median(runs):.2f} s | | |")  # type: ignore[type-var]
            continue
        cold = statistics.median(r["seconds"][0] for r in runs)  # type: ignore[index]
        later = [s for r in runs for s in r["seconds"][1:]]  # type: ignore[index]
        warm = f"{statistics.median(later):.2f} s" if later else ""
        here = results[name.replace("worker", "in-process")][0]["scoped"]  # type: ignore[index]
        same = "yes" if all(r["scoped"] == here for r in runs) else "NO"  # type: ignore[index]
        print(f"| {name} | {cold:.2f} s | {warm} | {runs[0]['workers']} | {same} |")  # type: ignore[index]
    if options.json:
        options.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
