"""Where compiling a call structure pays: the compiled tier's first call (tracing and an
XLA compile) against the engine's calls, per kernel of `benchmarks/run.py`.

    python benchmarks/tiers.py [--only add,dma,...]

Each kernel runs in a fresh process per tier (so that no compile of an earlier kernel or
tier is reused): its first call and the median of five later calls, races off. The
break-even is how many calls the engine would make in the compile's extra time: `--tier
auto` compiles a structure once the engine has spent about 0.3 s on it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def child(key: str, tier: str) -> None:
    sys.path.insert(0, HERE)
    import jax

    import pallas_check
    import run as bench

    (b,) = [x for x in bench.all_benches(False) if x.key == key]
    with pallas_check.checking(races=False, dma=b.dma_mode, project=False, tier=tier):
        fn, args = b.build(False)
        f = jax.jit(fn)
        start = time.perf_counter()
        jax.block_until_ready(f(*args))
        first = time.perf_counter() - start
        later = []
        for _ in range(5):
            start = time.perf_counter()
            jax.block_until_ready(f(*args))
            later.append(time.perf_counter() - start)
    print(json.dumps({"first": first, "later": statistics.median(later)}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="add-256,add-1024,add-4096,dma-256,dma-1024,flash,"
                                       "flash-4096,nested,paged,paged-2048")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    print(f"{'kernel':<12} {'engine 1st':>10} {'engine':>9} {'compiled 1st':>12} "
          f"{'compiled':>9} {'break-even':>10}")
    for key in args.only.split(","):
        got = {}
        for tier in ("engine", "compiled"):
            out = subprocess.run([sys.executable, __file__, "--child", key, tier],
                                 capture_output=True, text=True, check=True)
            got[tier] = json.loads(out.stdout.strip().splitlines()[-1])
        e, c = got["engine"], got["compiled"]
        extra = c["first"] - e["first"]
        saved = e["later"] - c["later"]
        even = f"{max(extra, 0) / saved + 1:.0f} calls" if saved > 0 else "never"
        print(f"{key:<12} {e['first']:>9.3f}s {e['later'] * 1e3:>7.1f}ms {c['first']:>11.3f}s "
              f"{c['later'] * 1e3:>7.1f}ms {even:>10}", flush=True)


if __name__ == "__main__":
    main()
