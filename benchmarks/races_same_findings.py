"""Races on: the same findings from this tree as from another (issue 55.4's soundness check).

    python benchmarks/races_same_findings.py --against /tmp/old     # every sample + kernels
    python benchmarks/races_same_findings.py --against /tmp/old --samples 'dma_*' --jobs 2

Not part of the test suite. A change that makes race checking cheaper (accesses left out
of the race checker, fewer clock entries) must not change a finding. Each sample
(`samples/*.py`) runs with its docstring's `Run:` flags plus `--races --tier engine` (the
engine is what such a change touches; `--compile` and `--tpu` are dropped: no chip compile
is wanted here), and again with `--dma random --schedules 3`; and run.py's `paged`,
`flash` and `paged-2048` kernels run on the engine with races on, in-process. Each with
this tree's package and with `--against`'s (a checkout or a `git archive` of a commit),
in fresh processes. Compared: every finding as (kind, buffer, memory space, range, line,
actor, message), in order, and the exit code (`DIFFERENT`: exit 1); and each call's `races`
summary (`accesses_checked`, equal when accesses left out are counted; `longest_history`,
which may change with what the checker keeps, and which `--schedules` under a loaded
machine can change from run to run): `SUMMARY` where only that differs (noted, not a
failure). Prints one line per run and a total.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
KERNELS = ("paged", "flash", "paged-2048")
_DROPPED = {"--compile": 0, "--tpu": 1}  # flag -> how many values follow it


def _run_flags(sample: Path) -> list[str]:
    """The flags of the sample's `Run:` line (after its path), less the chip compile's."""
    match = re.search(r"Run:\s*pallas-check run \S+(.*)", sample.read_text())
    words = shlex.split(match.group(1)) if match else []
    kept, skip = [], 0
    for word in words:
        if skip:
            skip -= 1
            continue
        name = word.split("=", 1)[0]
        if name in _DROPPED:
            skip = _DROPPED[name] if "=" not in word else 0
            continue
        kept.append(word)
    return kept


def _summary(report: dict) -> list:
    """What is compared: every finding's identity and message, each call's race cost."""
    findings = [(f.get("kind"), f.get("buffer"), f.get("memory_space"),
                 json.dumps(f.get("index_range")),
                 (f.get("frames") or [{}])[0].get("line"), f.get("actor"), f.get("message"))
                for f in report.get("findings", [])]
    calls = [(c.get("kernel"), c.get("races")) for c in report.get("calls", [])]
    return [findings, calls]


def _sample(tree: Path, sample: Path, extra: list[str]) -> list:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        argv = [sys.executable, "-m", "pallas_check", "run", str(sample), *_run_flags(sample),
                "--races", "--tier", "engine", *extra, "--format", "json", "-o", str(out)]
        env = dict(os.environ, PYTHONPATH=str(tree), PALLAS_CHECK_CACHE_DIR="off")
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=900)
        if not out.exists():
            return [f"no report (exit {done.returncode}): {done.stderr.strip()[-300:]}"]
        return [done.returncode, *_summary(json.loads(out.read_text()))]


def _kernel_one(key: str) -> None:
    """In this process: one of run.py's kernels on the engine, races on; prints JSON."""
    os.environ["PALLAS_CHECK_CACHE_DIR"] = "off"
    sys.argv = sys.argv[:1]
    sys.path.insert(0, str(HERE))
    import jax

    import pallas_check
    import run as kernels

    bench = {b.key: b for b in kernels.all_benches(False)}[key]
    with pallas_check.checking(races=True, dma=bench.dma_mode, tier="engine",
                               project=False) as session:
        fn, args = bench.build(False)
        jax.block_until_ready(jax.jit(fn)(*args))
    print(json.dumps(_summary(json.loads(session.render("json")))))


def _kernel(tree: Path, key: str) -> list:
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--kernel", key],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode:
        return [f"failed: {done.stderr.strip()[-300:]}"]
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", type=Path, required=True)
    parser.add_argument("--samples", default="*", help="a glob of sample names")
    parser.add_argument("--after", default="", help="only samples named after this one"
                        " (to resume a run)")
    parser.add_argument("--variants", choices=("both", "plain", "random"), default="both",
                        help="the `Run:` flags, `--dma random --schedules 3`, or both")
    parser.add_argument("--no-kernels", action="store_true")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--kernel", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.kernel:
        _kernel_one(args.kernel)
        return 0
    trees = (ROOT, args.against.resolve())
    jobs: list[tuple[str, object]] = []
    if not args.no_kernels:  # (first: the kernels race checking costs most on)
        jobs += [(f"kernel {key}", lambda tree, k=key: _kernel(tree, k)) for key in KERNELS]
    variants = {"both": ([], ["--dma", "random", "--schedules", "3"]), "plain": ([],),
                "random": (["--dma", "random", "--schedules", "3"],)}[args.variants]
    for sample in sorted((ROOT / "samples").glob("*.py")):
        if sample.name > args.after and fnmatch.fnmatch(
                sample.name, args.samples + ("" if args.samples.endswith(".py") else ".py")):
            for extra in variants:
                jobs.append((f"{sample.name} {' '.join(extra)}".strip(),
                             lambda tree, s=sample, e=extra: _sample(tree, s, e)))
    differ = summaries = findings = 0

    def both(job: tuple[str, object]) -> tuple[str, list, list]:
        name, run = job
        return name, run(trees[0]), run(trees[1])  # type: ignore[operator]

    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for name, mine, theirs in pool.map(both, jobs):
            count = len(mine[1]) if len(mine) > 2 else 0
            findings += count
            same = mine == theirs
            status = "same" if same else "DIFFERENT" if mine[:2] != theirs[:2] else "SUMMARY"
            differ += status == "DIFFERENT"
            summaries += status == "SUMMARY"
            print(f"{status} {name}: {count} findings"
                  + ("" if same else f"\n  this tree: {mine}\n  against:   {theirs}"),
                  flush=True)
    print(f"\n{len(jobs)} runs, {findings} findings on this tree, {differ} with other"
          f" findings, {summaries} with another race summary only")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
