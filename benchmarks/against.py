"""Two commits side by side in one run: `python benchmarks/run.py --against REV`.

Why a mode of its own: on a shared or virtual host one process's speed swings by more than
the differences worth knowing about (on the 2-CPU VM this project is developed on, the same
code's per-call time went from 11 to 15 ms between processes, and a single before/after
round once read 1.43x on a row whose time is almost all the same compiled XLA code on both
sides). Two separate runs, one per commit, cannot tell a 10 % change from that. So this
mode measures both commits in the same run, paired, many times:

- REV is checked out into a temporary git worktree (removed at the end); the other side is
  this working tree, as it is now (uncommitted changes included: the header says so).
- Each side is timed by ITS OWN `benchmarks/run.py` (`one_sample`: fresh jit, warm-up call,
  timed second call), importing its own package, so an old commit is timed the way it timed
  itself. The kernels must be the same on both sides: their definitions are compared first,
  and a difference stops the run.
- The two sides run in two processes (`_lockstep.py`) that take each sample together: both
  build and warm up the same configuration, wait for each other, each idle the same 0.1 s
  (`_lockstep.SETTLE_S`: a second call made at once after the warm-up is faster than one
  after any pause, so the side ready first must not be the only one that paused), and make
  their timed call at the same moment, each pinned to its own CPU, the CPUs swapped every
  pair. Whatever slows the host down for a while slows both halves of a pair alike, and
  neither side keeps the faster CPU. With one CPU the two take turns, in an order that
  alternates every pair.
- Fresh processes each round (--rounds, default 3), because a process's speed also varies
  as a whole from one process to the next; each round samples every configuration
  --repeats times (default 5).
- Per row, the ratio that decides is this tree's fastest sample over REV's (`Row.ratio`
  says why), shown beside the paired ratios' median and middle half. A row whose ratio is
  over --limit (default 1.10) is marked SLOWER, and the exit code is 1.

Nothing here imports pallas_check: both sides are child processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
RUN = Path("benchmarks") / "run.py"
LOCKSTEP = Path(__file__).resolve().parent / "_lockstep.py"
# Between these two markers run.py defines its kernels; both sides must agree on them.
_KERNELS = re.compile(r"^# Kernels\.$(.*?)^def select\(", re.M | re.S)


class AgainstError(RuntimeError):
    """The comparison cannot be made (unknown revision, kernels differ, a side failed)."""


@dataclass
class Side:
    """One side of the comparison: a source tree whose benchmarks/run.py measures it."""

    label: str
    tree: Path
    # samples[key][mode]: every timed second call, in order (paired index by index with
    # the other side's); checked[key]: races on, the accesses the race checker checked.
    samples: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    checked: dict[str, tuple[int, int]] = field(default_factory=dict)

    def record(self, key: str, mode: str, got: dict) -> None:
        self.samples.setdefault(key, {}).setdefault(mode, []).append(got["seconds"])
        if "accesses_checked" in got:
            self.checked[key] = (got["accesses_checked"], got.get("max_history", 0))


def _git(*args: str, cwd: Path = ROOT) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        raise AgainstError(f"git {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout.strip()


def describe_this_tree() -> str:
    """This tree's commit, and whether uncommitted changes are measured with it."""
    head = _git("rev-parse", "--short", "HEAD")
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return f"{head}+uncommitted" if dirty else head


@contextlib.contextmanager
def checked_out(rev: str, repo: Path = ROOT) -> Iterator[tuple[str, Path]]:
    """REV in a temporary worktree (detached; removed on the way out, interrupt included)."""
    try:
        sha = _git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", cwd=repo)
    except AgainstError:
        raise AgainstError(f"{rev!r} is not a commit of {repo}") from None
    where = Path(tempfile.mkdtemp(prefix="pallas-check-against-"))
    _git("worktree", "add", "--detach", "--force", str(where), sha, cwd=repo)
    try:
        yield sha[:7], where
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(where)], cwd=repo,
                       capture_output=True)
        shutil.rmtree(where, ignore_errors=True)
        subprocess.run(["git", "worktree", "prune"], cwd=repo, capture_output=True)


def require_same_kernels(base: Side, this: Side) -> None:
    """A ratio means something only if both sides run the same kernels at the same sizes."""
    texts = []
    for side in (base, this):
        found = _KERNELS.search((side.tree / RUN).read_text())
        if not found:
            raise AgainstError(f"{side.label}: no '# Kernels.' section in {RUN}")
        texts.append(found.group(1))
    if texts[0] != texts[1]:
        raise AgainstError(f"the kernels in {RUN} differ between {base.label} and"
                           f" {this.label}: their times cannot be compared")


def _child_env(tree: Path) -> dict[str, str]:
    """The side's own package first on the path; no PALLAS_CHECK_* setting leaks in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PALLAS_CHECK_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), env.get("PYTHONPATH")]))
    return env


def two_cpus() -> tuple[int, int] | None:
    """Two CPUs this process may use, or None (then the sides take turns)."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    return (cpus[0], cpus[1]) if len(cpus) >= 2 else None


class Child:
    """A side's `_lockstep.py` process: one sample at a time, held before its timed call."""

    def __init__(self, side: Side, log: Path) -> None:
        self.side = side
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, str(LOCKSTEP), str(side.tree)], cwd=side.tree,
            env=_child_env(side.tree), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=log.open("w"), text=True, bufsize=1)
        self.expect("ready")

    def expect(self, what: str) -> dict:
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line:
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-15:])
            raise AgainstError(f"{self.side.label}: the benchmark process ended"
                               f" (exit {self.proc.wait()}):\n{tail}")
        got = json.loads(line)
        if "error" in got:
            raise AgainstError(f"{self.side.label}: {got['error']}")
        if what not in got:
            raise AgainstError(f"{self.side.label}: expected {what!r}, got {got}")
        return got

    def tell(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _pair(children: list[Child], key: str, mode: str, cpus: tuple[int, int] | None
          ) -> list[dict]:
    """One sample of (key, mode) on each side. With two CPUs both warm up, wait for each
    other, then time their call at the same moment; with one they take turns."""
    if cpus:
        for child, cpu in zip(children, cpus):
            child.tell(json.dumps({"key": key, "mode": mode, "cpu": cpu}))
        for child in children:
            child.expect("warm")
        for child in children:
            child.tell("go")
        return [child.expect("seconds") for child in children]
    out = []
    for child in children:
        child.tell(json.dumps({"key": key, "mode": mode, "cpu": None}))
        child.expect("warm")
        child.tell("go")
        out.append(child.expect("seconds"))
    return out


def measure(base: Side, this: Side, configs: Sequence[tuple[str, str]], rounds: int,
            repeats: int, say) -> None:
    """Fresh processes each round; in a round, every configuration `repeats` times, the
    sides paired sample by sample and, for each configuration, the CPUs (or the order)
    swapped from one pair to the next."""
    cpus = two_cpus()
    with tempfile.TemporaryDirectory(prefix="pallas-check-against-") as tmp:
        for r in range(rounds):
            t0 = time.perf_counter()
            children: list[Child] = []
            try:
                for side in (base, this):
                    children.append(Child(side, Path(tmp) / f"{r}-{len(children)}.log"))
                for repeat in range(repeats):
                    # Each configuration's pairs alternate CPUs (or order) from one pair to
                    # the next, so neither side keeps a CPU for a row (counting pairs over
                    # all configurations would pin a row to one CPU whenever their number
                    # is even).
                    pair = r * repeats + repeat
                    lineup = children if pair % 2 == 0 else children[::-1]
                    for key, mode in configs:
                        for child, got in zip(lineup, _pair(lineup, key, mode, cpus)):
                            child.side.record(key, mode, got)
            finally:
                for child in children:
                    child.close()
            say(f"[round {r + 1}/{rounds}] {len(configs)} configurations x {repeats}"
                f" repeats, both sides: {time.perf_counter() - t0:.0f} s")


@dataclass
class Row:
    """One (kernel, mode): both sides' samples, paired index by index."""

    key: str
    mode: str
    base: list[float]
    this: list[float]

    @property
    def ratio(self) -> float:
        """This tree's fastest sample over REV's: what decides the row. The host's noise
        only ever adds time, so the fastest of many samples is the closest to what the code
        itself costs. Measured on this project's VM with the same code on both sides (an
        A/A run, benchmarks/README.md), this ratio strayed least from 1 (at most 1.06 over
        22 rows), less than the median of the paired ratios (1.10) or the ratio of the
        medians (1.25)."""
        return min(self.this) / min(self.base)

    @property
    def pair_ratios(self) -> list[float]:
        return [b / a for a, b in zip(self.base, self.this)]

    def pair_quartiles(self) -> tuple[float, float, float]:
        """The paired ratios' lower quartile, median and upper quartile: how the typical
        call compares, and how much one pair alone says."""
        ratios = self.pair_ratios
        if len(ratios) < 2:
            return ratios[0], ratios[0], ratios[0]
        low, mid, high = statistics.quantiles(ratios, n=4)
        return low, mid, high


def rows(base: Side, this: Side, configs: Sequence[tuple[str, str]]) -> list[Row]:
    out = []
    for key, mode in configs:
        a = base.samples.get(key, {}).get(mode)
        b = this.samples.get(key, {}).get(mode)
        if a and b:
            out.append(Row(key, mode, a, b))
    return out


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def report(table_rows: list[Row], base: Side, this: Side, limit: float, rounds: int,
           repeats: int, paired: bool) -> int:
    """The table; the race-cost table of this tree; the exit code (1: a row over limit)."""
    console = Console(width=130)
    how = ("both sides at once, one CPU each, swapped every pair" if paired
           else "the sides taking turns")
    t = Table(title=f"Second-call time, {this.label} against {base.label}, in the same run:"
                    f" {rounds} rounds × {repeats} pairs ({how})")
    for col in ("kernel", "mode", f"{base.label} fastest / median",
                f"{this.label} fastest / median", "ratio of fastest",
                "paired ratios: median (middle half)", ""):
        t.add_column(col, justify="left" if col in ("kernel", "mode", "") else "right")
    over = 0
    for row in table_rows:
        slower = row.ratio > limit
        over += slower
        low, mid, high = row.pair_quartiles()
        t.add_row(row.key, row.mode,
                  f"{_ms(min(row.base))} / {_ms(statistics.median(row.base))}",
                  f"{_ms(min(row.this))} / {_ms(statistics.median(row.this))}",
                  f"{row.ratio:.2f}×", f"{mid:.2f}× ({low:.2f}-{high:.2f})",
                  f"[bold red]SLOWER than {limit:.2f}×[/]" if slower else "ok")
    console.print(t)
    cost = [(row, this.checked[row.key]) for row in table_rows
            if row.mode == "pc-on" and row.key in this.checked]
    if cost:
        t = Table(title=f"Race checker cost ({this.label}, races on, median call)")
        for col in ("kernel", "accesses checked", "longest history", "time / access"):
            t.add_column(col, justify="left" if col == "kernel" else "right")
        for row, (accesses, longest) in cost:
            t.add_row(row.key, str(accesses), str(longest),
                      f"{statistics.median(row.this) / accesses * 1e6:.1f} µs")
        console.print(t)
    verdict = (f"{over} row(s) more than {(limit - 1) * 100:.0f} % slower" if over
               else f"no row more than {(limit - 1) * 100:.0f} % slower")
    console.print(f"{this.label} against {base.label}: {verdict} (ratio of the fastest"
                  " samples).")
    return 1 if over else 0


def run_against(rev: str, configs: Sequence[tuple[str, str]], rounds: int, repeats: int,
                limit: float, json_path: str | None, say) -> int:
    this = Side(f"this tree ({describe_this_tree()})", ROOT)
    with checked_out(rev) as (sha, tree):
        base = Side(sha if sha.startswith(rev) else f"{rev} ({sha})", tree)
        require_same_kernels(base, this)
        measure(base, this, configs, rounds, repeats, say)
    table_rows = rows(base, this, configs)
    paired = two_cpus() is not None
    code = report(table_rows, base, this, limit, rounds, repeats, paired)
    if json_path:
        Path(json_path).write_text(json.dumps({
            "against": base.label, "this": this.label, "rounds": rounds, "repeats": repeats,
            "limit": limit, "paired_on_two_cpus": paired,
            "rows": [{"key": row.key, "mode": row.mode, "ratio_of_fastest": row.ratio,
                      "paired_ratio_quartiles": row.pair_quartiles()}
                     for row in table_rows],
            "samples": {base.label: base.samples, this.label: this.samples},
            "race_cost": {k: {"accesses": a, "longest_history": h}
                          for k, (a, h) in this.checked.items()}}, indent=2))
    return code
