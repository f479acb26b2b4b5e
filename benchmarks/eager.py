"""Eager calls: N calls of a tiny kernel, not jitted, each traced anew (issue 15).

Each configuration runs in a fresh process (`tests/scripts/kernel_loop.py N eager`):
pallas-check (`python -m pallas_check run`) against JAX's own `interpret=True`, at 50 / 200 /
2000 calls. Prints a markdown table of wall time and peak RSS (the process's max RSS).

    python benchmarks/eager.py [--calls 50,200,2000]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOOP = ROOT / "tests" / "scripts" / "kernel_loop.py"


def measure(command: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS in MiB) of one fresh process."""
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(command)}: {process.stderr.read().decode()[-500:]}")
    return seconds, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", default="50,200,2000")
    counts = [int(c) for c in parser.parse_args().calls.split(",")]
    rows = []
    for n in counts:
        ours = measure([sys.executable, "-m", "pallas_check", "run", str(LOOP), "--",
                        str(n), "eager"])
        theirs = measure([sys.executable, str(LOOP), str(n), "eager-interpret"])
        rows.append((n, ours, theirs))
        print(f"{n} calls: pallas-check {ours[0]:.1f} s {ours[1]:.0f} MiB;"
              f" JAX interpret=True {theirs[0]:.1f} s {theirs[1]:.0f} MiB", file=sys.stderr)
    print(f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python"
          f" {platform.python_version()}\n")
    print("| eager calls | pallas-check | JAX `interpret=True` | time ratio (JAX / ours) |"
          " pallas-check peak RSS | JAX peak RSS |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n, (s_ours, m_ours), (s_theirs, m_theirs) in rows:
        print(f"| {n} | {s_ours:.1f} s | {s_theirs:.1f} s | {s_theirs / s_ours:.2f}x |"
              f" {m_ours:.0f} MiB | {m_theirs:.0f} MiB |")


if __name__ == "__main__":
    main()
