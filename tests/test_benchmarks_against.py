"""`benchmarks/run.py --against REV` (benchmarks/against.py, benchmarks/_lockstep.py): the
comparison's machinery, without JAX. A fake side tree stands in for a commit: its
benchmarks/run.py has the two functions the lockstep process uses (`all_benches`,
`one_sample` with its `on_warm` hook), and reports a time fixed per tree, so what the
machinery pairs, divides and decides is known. It also reports what the lockstep process
slept between the go and its timed call (`settled`), through `time.sleep` wrapped."""

from __future__ import annotations

import select
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import _lockstep  # noqa: E402
import against  # noqa: E402

FAKE_RUN = '''
import os, types, time
_slept = []
_sleep = time.sleep
def _recorded_sleep(seconds):
    _slept.append(seconds)
    _sleep(seconds)
time.sleep = _recorded_sleep  # the lockstep process's own `time.sleep` too
# Kernels.
KERNELS = "{kernels}"
def select(benches, only):
    return benches
def all_benches(quick):
    return [types.SimpleNamespace(key=k) for k in ("small", "big")]
def one_sample(bench, mode, on_warm=None):
    _sleep({ready_after})  # warm-up
    del _slept[:]
    on_warm(0.5)
    settled = sum(_slept)
    seconds = {seconds} * (10 if bench.key == "big" else 1)
    seconds += {per_cpu} * sorted(os.sched_getaffinity(0))[0]  # which CPU timed it
    out = {{"seconds": seconds, "warmup_seconds": 0.5, "settled": settled,
           "note": "not a number"}}
    if mode == "pc-on":
        out["accesses_checked"] = 40
        out["max_history"] = 3
    return out
'''


def fake_tree(where: Path, seconds: float, kernels: str = "same", per_cpu: float = 0.0,
              ready_after: float = 0.0) -> Path:
    (where / "benchmarks").mkdir(parents=True)
    (where / "benchmarks" / "run.py").write_text(FAKE_RUN.format(
        seconds=seconds, kernels=kernels, per_cpu=per_cpu, ready_after=ready_after))
    return where


def test_the_lockstep_process_holds_its_timed_call_until_told_to_go(tmp_path):
    side = against.Side("fake", fake_tree(tmp_path / "t", 0.002))
    child = against.Child(side, tmp_path / "log")
    try:
        child.tell('{"key": "small", "mode": "pc-off", "cpu": null}')
        assert child.expect("warm") == {"warm": 0.5}
        ready, _, _ = select.select([child.proc.stdout], [], [], 0.5)
        assert not ready, "the sample was timed before the other side was ready"
        child.tell("go")
        got = child.expect("seconds")
        # Only numbers travel back: the parent pairs and divides them. Between the go and
        # the timed call the process idled SETTLE_S.
        assert got == {"seconds": 0.002, "warmup_seconds": 0.5, "settled": _lockstep.SETTLE_S}
    finally:
        child.close()


def test_both_sides_idle_the_same_pause_before_the_timed_call_whichever_was_ready_first(
        tmp_path):
    """A second call made at once after its warm-up is faster than one made after any
    pause: the side ready first, idle until the other was, read as slower (the paged row,
    1.5-1.7x against a commit whose warm-up was slower). After the go each side idles
    SETTLE_S, at least the pause after which the second call stops slowing (10 ms), so
    both time their call after a pause, the late side too."""
    assert _lockstep.SETTLE_S >= 0.01
    early = against.Side("early", fake_tree(tmp_path / "early", 0.002))
    late = against.Side("late", fake_tree(tmp_path / "late", 0.002, ready_after=0.3))
    children = [against.Child(early, tmp_path / "e.log"), against.Child(late, tmp_path / "l.log")]
    try:
        for cpus in (against.two_cpus(), None):  # together, and taking turns
            got = against._pair(children, "small", "pc-off", cpus)
            assert [g["settled"] for g in got] == [_lockstep.SETTLE_S] * 2, cpus
    finally:
        for child in children:
            child.close()


def test_a_side_that_fails_stops_the_comparison_with_its_message(tmp_path):
    side = against.Side("fake", fake_tree(tmp_path / "t", 0.002))
    child = against.Child(side, tmp_path / "log")
    try:
        child.tell('{"key": "no-such-kernel", "mode": "pc-off", "cpu": null}')
        with pytest.raises(against.AgainstError, match="fake: KeyError: 'no-such-kernel'"):
            child.expect("warm")
    finally:
        child.close()


def test_both_sides_are_paired_sample_by_sample_and_the_ratio_decides(tmp_path, capsys):
    base = against.Side("base", fake_tree(tmp_path / "base", 0.010))
    this = against.Side("this", fake_tree(tmp_path / "this", 0.012))
    configs = [("small", "pc-off"), ("big", "pc-on")]
    said: list[str] = []
    against.measure(base, this, configs, rounds=2, repeats=3, say=said.append)
    assert len(said) == 2
    assert base.samples == {"small": {"pc-off": [0.010] * 6}, "big": {"pc-on": [0.1] * 6}}
    assert this.samples["big"]["pc-on"] == [pytest.approx(0.12)] * 6
    assert this.checked == {"big": (40, 3)}
    rows = against.rows(base, this, configs)
    assert [(r.key, r.mode, round(r.ratio, 6)) for r in rows] == [
        ("small", "pc-off", 1.2), ("big", "pc-on", 1.2)]

    assert against.report(rows, base, this, limit=1.25, rounds=2, repeats=3,
                          paired=True) == 0
    assert "no row more than 25 % slower" in capsys.readouterr().out
    assert against.report(rows, base, this, limit=1.10, rounds=2, repeats=3,
                          paired=True) == 1
    out = capsys.readouterr().out
    assert out.count("SLOWER than 1.10×") == 2
    assert "2 row(s) more than 10 % slower" in out
    # The race-cost row: this side's median over the accesses it checked.
    assert "3000.0 µs" in out  # 0.12 s / 40 accesses


def test_the_fastest_samples_decide_a_row(capsys):
    """The host's noise only adds time: a row whose fastest call is 20 % slower is slower,
    even where most pairs tie."""
    row = against.Row("k", "pc-off", base=[0.010, 0.020, 0.030], this=[0.012, 0.020, 0.030])
    assert row.ratio == pytest.approx(1.2)
    assert row.pair_quartiles()[1] == pytest.approx(1.0)
    side = against.Side("s", Path("."))
    assert against.report([row], side, side, limit=1.10, rounds=1, repeats=3,
                          paired=True) == 1
    out = capsys.readouterr().out
    assert "1.20×" in out and "SLOWER than 1.10×" in out


@pytest.mark.skipif(against.two_cpus() is None, reason="needs two CPUs to pin the sides to")
def test_each_configuration_swaps_cpus_from_one_pair_to_the_next(tmp_path):
    """With an even number of configurations, counting pairs over all of them once left
    every row on the same CPU for a side in every pair; a slow CPU then read as a slow
    commit. The fake's time says which CPU timed it (+1 s on the second CPU)."""
    first, second = against.two_cpus()
    base = against.Side("base", fake_tree(tmp_path / "base", 0.0, per_cpu=1.0))
    this = against.Side("this", fake_tree(tmp_path / "this", 0.0, per_cpu=1.0))
    configs = [("small", "pc-off"), ("small", "pc-on")]
    against.measure(base, this, configs, rounds=2, repeats=3, say=lambda _: None)
    for side, starts_on in ((base, first), (this, second)):
        for key, mode in configs:
            cpus = side.samples[key][mode]
            assert cpus == [starts_on, first + second - starts_on] * 3, (side.label, mode)


def test_sides_with_different_kernels_are_not_compared(tmp_path):
    base = against.Side("base", fake_tree(tmp_path / "base", 0.01, kernels="a"))
    this = against.Side("this", fake_tree(tmp_path / "this", 0.01, kernels="b"))
    with pytest.raises(against.AgainstError, match="kernels .* differ"):
        against.require_same_kernels(base, this)
    against.require_same_kernels(base, against.Side("same", fake_tree(tmp_path / "s", 0.02,
                                                                       kernels="a")))


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def test_the_revision_is_checked_out_aside_and_removed_afterwards(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    for text in ("old", "new"):
        (repo / "f.txt").write_text(text)
        _git(repo, "add", "f.txt")
        _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", text)
    with against.checked_out("HEAD~1", repo) as (sha, tree):
        assert sha == _git(repo, "rev-parse", "--short=7", "HEAD~1")
        assert (tree / "f.txt").read_text() == "old"
        assert (repo / "f.txt").read_text() == "new"  # the user's tree is left alone
    assert not tree.exists()
    assert _git(repo, "worktree", "list").count("\n") == 0
    with pytest.raises(against.AgainstError, match="'nope' is not a commit"):
        with against.checked_out("nope", repo):
            pass


def test_run_py_refuses_quick_with_against():
    done = subprocess.run([sys.executable, str(BENCHMARKS / "run.py"), "--against", "HEAD",
                           "--quick"], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == (
        "--against measures the full sizes: leave --quick out")

