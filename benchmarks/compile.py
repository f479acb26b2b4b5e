"""Every kernel JAX ships in jax/experimental/pallas/ops/tpu/ compiled for real TPUs.

    python benchmarks/compile.py                  # all cases, v5e,v6e,v7x
    python benchmarks/compile.py --only matmul    # some cases
    python benchmarks/compile.py --json out.json  # also write every number

Not part of the test suite. For each case script of tests/shipped_kernels/ (the sizes the
shipped-kernel tests use), in fresh processes, one after the other:

1. `pallas-check compile CASE --tpu v5e,v6e,v7x`: wall time of the whole command, and how
   many calls it reached (it answers calls with zeros, so a case script that checks its
   results stops at its first check: only the calls before it are compiled);
2. `pallas-check run CASE` and `pallas-check run CASE --compile --tpu v5e,v6e,v7x --format
   json`: wall time of the whole command (process start to exit), so the difference is what
   `--compile` costs over a plain run;
3. `benchmarks/_compile_calls.py CASE`: the same checked run in-process, then each call's
   result per generation, its VMEM use and its compile time (`lower().compile()`, timed
   around it; the first compile of a process also loads libtpu), which the run's JSON
   report leaves out to stay deterministic.

Prints a Markdown table (the one in benchmarks/README.md) and, per failed compile, the
finding's message.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = ROOT / "tests" / "shipped_kernels"
# case -> extra options of `run` (as tests/scenarios/test_shipped_kernels.py runs them)
RUN_OPTIONS = {"example_kernel": [], "matmul": ["--cores", "2"], "flash_attention": [],
               "paged_attention": ["--cores", "2"], "ragged_paged_attention": [],
               "megablox_gmm": [], "splash_attention": [], "random": [],
               "all_gather": ["--devices", "4"]}
GENERATIONS = "v5e,v6e,v7x"
# Compiled only (`pallas-check compile`), for a size where the generations differ.
COMPILE_ONLY = {"flash_attention_2048": Path(__file__).resolve().parent
                / "flash_attention_2048.py"}


def _pallas_check(*args: str) -> tuple[int, float, str]:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pallas_check", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=1800)
    return proc.returncode, time.perf_counter() - started, proc.stdout + proc.stderr


def measure(case: str) -> dict:
    script = str(CASES / f"case_{case}.py")
    devices = [o for o in RUN_OPTIONS[case] if o == "--devices"]
    extra = RUN_OPTIONS[case][:2] if devices else []
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "compile.json"
        code, compile_wall, output = _pallas_check(
            "compile", script, "--tpu", GENERATIONS, "--format", "json", "--output",
            str(report), *extra)
        data = json.loads(report.read_text()) if report.exists() else None
        compile_calls = len((data or {}).get("calls", []))
        plain_code, plain_wall, _ = _pallas_check("run", script, *RUN_OPTIONS[case])
        run_report = Path(tmp) / "run.json"
        with_code, with_wall, output = _pallas_check(
            "run", script, *RUN_OPTIONS[case], "--compile", "--tpu", GENERATIONS,
            "--format", "json", "--output", str(run_report))
        data = json.loads(run_report.read_text()) if run_report.exists() else None
    if data is not None:  # per-call compile times: the run's report has none
        data["calls"] = _timed_calls(script, case)
    return {"case": case, "compile_exit": code, "compile_wall_s": compile_wall,
            "compile_only_calls": compile_calls,
            "report": data, "compile_output": output if data is None else "",
            "run_exit": plain_code, "run_wall_s": plain_wall,
            "run_compile_exit": with_code, "run_compile_wall_s": with_wall}


def _timed_calls(script: str, case: str) -> list[dict]:
    options = RUN_OPTIONS[case]
    devices = options[options.index("--devices") + 1] if "--devices" in options else "1"
    cores = options[options.index("--cores") + 1] if "--cores" in options else "1"
    proc = subprocess.run([sys.executable, str(Path(__file__).parent / "_compile_calls.py"),
                           script, GENERATIONS, devices, cores], cwd=ROOT,
                          capture_output=True, text=True, timeout=1800, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure_compile_only(case: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "compile.json"
        code, wall, output = _pallas_check("compile", str(COMPILE_ONLY[case]), "--tpu",
                                           GENERATIONS, "--format", "json", "--output",
                                           str(report))
        data = json.loads(report.read_text()) if report.exists() else None
    return {"case": case, "compile_exit": code, "compile_wall_s": wall, "report": data,
            "compile_output": output if data is None else ""}


def _cell(entry: dict) -> str:
    if entry["status"] == "ok":
        scoped = entry["vmem_scoped_bytes"] or 0
        scratch = entry["vmem_scratch_bytes"] or 0
        extra = f" + {scratch / 2**20:.2f} scratch" if scratch else ""
        return (f"ok, {scoped / 2**20:.2f}{extra} / {entry['vmem_scoped_limit_bytes'] / 2**20:.0f}"
                f" MiB, {entry['compile_seconds']:.2f} s")
    code = f" {entry['error_code']}" if entry.get("error_code") else ""
    return f"**{entry['status']}{code}**, {entry['compile_seconds']:.2f} s"


def table(results: list[dict]) -> str:
    generations = GENERATIONS.split(",")
    lines = ["| case | call | kernel | " + " | ".join(generations) + " |",
             "|---|---|---|" + "---|" * len(generations)]
    for r in results:
        calls = (r["report"] or {}).get("calls", [])
        if not calls:
            lines.append(f"| {r['case']} | - | (no report: exit {r['compile_exit']}) |"
                         + " |" * len(generations))
        for call in calls:
            cells = [_cell(call["compiled"][g]) if g in call["compiled"] else ""
                     for g in generations]
            lines.append(f"| {r['case']} | {call['index']} | {call['kernel']} | "
                         + " | ".join(cells) + " |")
    lines += ["", "| case | pallas-check run (s) | run --compile (s) | cost of --compile |"
              " compile only (s) |", "|---|---|---|---|---|"]
    for r in results:
        if "run_wall_s" not in r:
            continue
        lines.append(f"| {r['case']} | {r['run_wall_s']:.1f} (exit {r['run_exit']}) |"
                     f" {r['run_compile_wall_s']:.1f} (exit {r['run_compile_exit']}) |"
                     f" +{r['run_compile_wall_s'] - r['run_wall_s']:.1f} s |"
                     f" {r['compile_wall_s']:.1f} (exit {r['compile_exit']},"
                     f" {r['compile_only_calls']} call(s)) |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="", help="comma-separated case names")
    parser.add_argument("--json", default=None, help="also write every number here")
    args = parser.parse_args()
    wanted = args.only.split(",") if args.only else None
    results = []
    for case in RUN_OPTIONS:
        if wanted is None or case in wanted:
            print(f"... {case}", file=sys.stderr, flush=True)
            results.append(measure(case))
    for case in COMPILE_ONLY:
        if wanted is None or case in wanted:
            print(f"... {case} (compile only)", file=sys.stderr, flush=True)
            results.append(measure_compile_only(case))
    print(table(results))
    for r in results:
        for f in (r["report"] or {}).get("findings", []):
            frame = f["frames"][0] if f["frames"] else {}
            print(f"- {r['case']} call {f['call_index']} {f['kernel']['name']}:"
                  f" {f['kind']} at {Path(frame.get('file', '?')).name}:{frame.get('line')}:"
                  f" {f['message']}")
        if r["compile_output"]:
            print(f"- {r['case']}: {r['compile_output'][-600:]}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
