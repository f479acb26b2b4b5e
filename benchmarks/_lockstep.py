"""One side of `run.py --against`: a process that times samples when told to (not run by hand).

    python /path/to/benchmarks/_lockstep.py SIDE_TREE

It imports SIDE_TREE's own `benchmarks/run.py` (which imports SIDE_TREE's own package:
the parent puts SIDE_TREE first on PYTHONPATH) and takes one JSON line per sample on stdin:

    parent: {"key": "paged", "mode": "pc-off", "cpu": 1}
    child:  {"warm": 0.41}               after the warm-up call, then it waits for
    parent: go                           the parent's go, so both sides time at once
                                         (each first idles SETTLE_S: below)
    child:  {"seconds": 0.0123, ...}     run.py's one_sample result, or {"error": "..."}

The timed call is `one_sample`'s own, from the side's own run.py: an old commit is timed
the way it timed itself; this file only holds the timed call back until the other side is
ready too (through one_sample's `on_warm` hook, which every run.py since 0b00ffe has).

Why both sides idle SETTLE_S after the go: a second call made at once after the warm-up
is faster than one made after any pause (paged attention under the compiled tier: 3.4 ms
at once, 4.2-4.6 ms after 10 ms to 3 s of sleep or of a busy Python loop; see
benchmarks/README.md, "run.py --against: what read as a second-call regression"). Held
only until the other side was ready, the side whose warm-up ended first idled before its
timed call and the other did not: a commit whose setup and warm-up got faster read as a
slower second call (paged 1.5-1.8x against 97d92ba, all of it this). Idling SETTLE_S after
the go, both sides make their timed call after a pause of at least that, whichever was
ready first, and still at the same moment.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

# Seconds each side idles between the parent's go and its timed call (see the module): more
# than the pause after which the second call's time stops growing (10 ms measured).
SETTLE_S = 0.1


def _pin(cpu: int | None) -> None:
    """Every thread of this process (JAX's and XLA's pools included) onto one CPU; threads
    started later inherit it from the thread that starts them."""
    if cpu is None:
        return
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), {cpu})
        except OSError:
            pass  # the thread ended meanwhile


def main() -> None:
    tree = Path(sys.argv[1]).resolve()
    # The protocol keeps the real stdout; anything printed by the side goes to stderr.
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    sys.path.insert(0, str(tree / "benchmarks"))
    import run  # the side's own benchmarks/run.py (and through it, its own package)

    benches = {b.key: b for b in run.all_benches(False)}

    def send(message: dict) -> None:
        protocol.write(json.dumps(message) + "\n")

    def hold(warm: float) -> None:
        send({"warm": warm})
        if sys.stdin.readline().strip() != "go":
            raise SystemExit(0)  # the parent went away
        time.sleep(SETTLE_S)  # the same pause on both sides, whichever waited

    send({"ready": str(tree)})
    for line in sys.stdin:
        ask = json.loads(line)
        _pin(ask.get("cpu"))
        try:
            got = run.one_sample(benches[ask["key"]], ask["mode"], on_warm=hold)
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which stops
            send({"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:300]})
            continue
        send({k: v for k, v in got.items() if isinstance(v, (int, float))})


if __name__ == "__main__":
    main()
