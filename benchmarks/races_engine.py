"""Races on against races off on the engine: the second call's CPU time (issue 55.4).

    python benchmarks/races_engine.py                        # paged and flash, 3 rounds
    python benchmarks/races_engine.py --against /tmp/old     # also another checkout, paired
    python benchmarks/races_engine.py --kernels paged --rounds 5 --calls 20

Not part of the test suite. The kernels are run.py's (`all_benches()`: `paged`, `flash`, or
any other key), forced onto the engine (`pallas_check.checking(tier="engine")`) with its
DMA mode, races on and off. Each configuration runs in a fresh process: build, jit, one
call (tracing, compiles, first-call caches), then `--calls` calls, each timed by
`time.process_time` (the process's CPU time: on a shared machine wall time moves 2-10x);
its fastest call is its number. A round runs every configuration once, alternating (per
kernel: this tree off, on, then `--against`'s off, on), so that a busy moment of the
machine falls on all of them; the table gives each configuration's range over the rounds,
and the ratio on/off of each round. `--against DIR`: a checkout (or `git archive` of a
commit) whose `pallas_check` is run the same way, with this tree's kernels. See
benchmarks/README.md, "Issue 55.4".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _one(kernel: str, races: bool, calls: int) -> None:
    """In this process: one configuration; prints its fastest call (ms) as JSON."""
    os.environ.setdefault("PALLAS_CHECK_CACHE_DIR", "off")  # hermetic, as run.py
    sys.argv = sys.argv[:1]  # (run.py parses nothing at import, but keep it clean)
    sys.path.insert(0, str(HERE))
    import jax

    import pallas_check
    import run as kernels

    bench = {b.key: b for b in kernels.all_benches(False)}[kernel]
    times = []
    with pallas_check.checking(races=races, dma=bench.dma_mode, tier="engine",
                               project=False):
        fn, args = bench.build(False)
        jitted = jax.jit(fn)
        jax.block_until_ready(jitted(*args))
        for _ in range(calls):
            start = time.process_time()
            jax.block_until_ready(jitted(*args))
            times.append(time.process_time() - start)
    print(json.dumps({"ms": min(times) * 1e3}))


def _spawn(tree: Path, kernel: str, races: bool, calls: int) -> float:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--one", kernel,
                          "1" if races else "0", str(calls)],
                         env=env, cwd=tree, capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["ms"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", default="paged,flash")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=15)
    parser.add_argument("--against", type=Path, help="another checkout's root")
    parser.add_argument("--one", nargs=3, metavar=("KERNEL", "RACES", "CALLS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        _one(args.one[0], args.one[1] == "1", int(args.one[2]))
        return
    trees = {"this tree": HERE.parent}
    if args.against:
        trees["against"] = args.against.resolve()
    got: dict[tuple[str, str, bool], list[float]] = {}
    for round_ in range(1, args.rounds + 1):
        for kernel in args.kernels.split(","):
            for name, tree in trees.items():
                for races in (False, True):
                    ms = _spawn(tree, kernel, races, args.calls)
                    got.setdefault((name, kernel, races), []).append(ms)
                    print(f"round {round_} {kernel:8} {name:9} races {'on ' if races else 'off'}"
                          f" {ms:7.1f} ms", flush=True)
    print()
    for kernel in args.kernels.split(","):
        for name in trees:
            off, on = got[(name, kernel, False)], got[(name, kernel, True)]
            ratios = [b / a for a, b in zip(off, on)]
            print(f"{kernel:8} {name:9} off {min(off):.1f}-{max(off):.1f} ms,"
                  f" on {min(on):.1f}-{max(on):.1f} ms,"
                  f" on/off per round {min(ratios):.2f}-{max(ratios):.2f}x")


if __name__ == "__main__":
    main()
