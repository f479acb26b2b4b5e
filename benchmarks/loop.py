"""A training loop checked in seconds (issue 29): `pallas-check run --calls 2` against
JAX's HLO interpreter (`interpret=True`), whole process, in the same run.

The script is tests/scripts/train_loop.py: a jitted step of two kernels (a BlockSpec-grid
matmul called twice, forward and gradient, and a parameter update), 500 steps. Two
families: the update copies its gradient in with a DMA and a semaphore (`dma`: its calls
passed through run on the engine with its checks off), or is a plain elementwise kernel
(`pure`: every call passed through runs as XLA, intercept/xla_path.py). Each process is fresh; the
final parameters' checksum of both sides must agree (the same outputs). Wall time is of
the whole process; CPU is user + system time (steadier on a shared machine).

    python benchmarks/loop.py [--steps 500] [--repeat 3] [--only pure|dma]

The goal: pallas-check ≤ 1.5x the HLO interpreter's wall time.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "scripts" / "train_loop.py"
FAMILIES = {"dma": "1", "pure": "0"}  # TRAIN_LOOP_DMA


def run_once(command: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds, the script's checksum) of one fresh process."""
    before = os.times()
    started = time.perf_counter()
    process = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = os.times()
    if process.returncode != 0:
        raise SystemExit(f"failed: {' '.join(command)}: {process.stderr[-800:]}")
    cpu = (after.children_user - before.children_user
           + after.children_system - before.children_system)
    match = re.search(r"checksum (\S+)", process.stdout)
    return wall, cpu, match.group(1) if match else "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3, help="best of N processes")
    parser.add_argument("--only", choices=sorted(FAMILIES))
    args = parser.parse_args()
    rows = []
    for family, dma in FAMILIES.items():
        if args.only and family != args.only:
            continue
        env = {**os.environ, "TRAIN_LOOP_DMA": dma, "PYTHONPATH": str(ROOT)}
        ours_cmd = [sys.executable, "-m", "pallas_check", "run", str(SCRIPT), "--calls", "2",
                    "--", str(args.steps)]
        theirs_cmd = [sys.executable, str(SCRIPT), str(args.steps)]
        ours, theirs = [], []
        for _ in range(args.repeat):  # interleaved: a busy moment hits both sides
            theirs.append(run_once(theirs_cmd, {**env, "TRAIN_LOOP_INTERPRET": "1"}))
            ours.append(run_once(ours_cmd, env))
        best_ours, best_theirs = min(ours), min(theirs)
        if best_ours[2] != best_theirs[2]:
            raise SystemExit(f"{family}: outputs differ: checksum {best_ours[2]} (pallas-check)"
                             f" vs {best_theirs[2]} (interpret=True)")
        rows.append((family, best_ours, best_theirs, min(o[1] for o in ours),
                     min(t[1] for t in theirs)))
        print(f"{family}: pallas-check --calls 2 {best_ours[0]:.2f} s,"
              f" interpret=True {best_theirs[0]:.2f} s", file=sys.stderr)
    print(f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python"
          f" {platform.python_version()}; {args.steps} steps, best of {args.repeat}\n")
    print("| loop | pallas-check `--calls 2` | JAX `interpret=True` | wall ratio |"
          " CPU ours | CPU JAX | CPU ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for family, ours, theirs, cpu_ours, cpu_theirs in rows:
        print(f"| {family} | {ours[0]:.2f} s | {theirs[0]:.2f} s | {ours[0] / theirs[0]:.2f}x |"
              f" {cpu_ours:.2f} s | {cpu_theirs:.2f} s | {cpu_ours / cpu_theirs:.2f}x |")


if __name__ == "__main__":
    main()
