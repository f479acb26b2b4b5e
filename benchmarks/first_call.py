"""First calls of small kernels (issue 55, item 3): pallas-check's defaults next to JAX's
interpreters, each first call in a fresh process, and a jitted function lowered without
being called.

    python benchmarks/first_call.py                      # every part (~10 min on 2 CPUs)
    python benchmarks/first_call.py --parts call,lower --rounds 5 --json first.json
    python benchmarks/first_call.py --parts suite        # the kernels as a pytest file
    python benchmarks/first_call.py --against /tmp/old   # also another checkout, paired

Parts:

- `call`: each kernel of `_first_call_kernels.py` (elementwise, reduction, a matmul with a
  grid, scalar prefetch) called once, jitted, in a fresh process per (kernel, mode, round).
- `lower`: `jax.jit(f).lower(*args).as_text()` of a function holding the kernel, in a
  fresh process, never called.
- `suite`: the kernels as a pytest file (a call test and a lower-only test per kernel, in
  one process, as a suite runs them; the lower-only tests draw their inputs with
  `jax.random`, as a suite's donation and signature tests do), `pytest --pallas-check`
  (cold, then warm) against pytest with the kernels given JAX's interpreters; each test's
  time from pytest's junit XML.

Modes:

| mode | how |
|---|---|
| `pc-cold` | `pallas_check.checking(project=False)`: the defaults (races on, `--tier auto`, each call compiled for the chip with libtpu at its lowering), `PALLAS_CHECK_CACHE_DIR` a fresh empty folder (nothing compiled before) |
| `pc-warm` | the same with that folder as the cold run left it (a suite's next run) |
| `pc-nochip` | cold, with `chip_compile=False`: the chip's compile's share is `pc-cold` less this |
| `tpu` | `interpret=pltpu.InterpretParams()` |
| `tpu-races` | `interpret=pltpu.InterpretParams(detect_races=True)` |
| `hlo` | `interpret=True` |

What is timed (`time.perf_counter`, after `import jax` and the kernel's inputs exist): the
jitted call with `block_until_ready` (`call`), or the lowering and its text (`lower`);
under pallas-check also the `with checking()` block around it (`block`: the session's
install, the call, the report). The tables show the median over `--rounds`, and the
ratio of pallas-check's block to JAX's TPU interpreter's call (target: at most 2).
`--against DIR` runs pallas-check's modes of another checkout (a `git worktree` of an
older commit) too, each right after this tree's (a drift of a shared machine touches
both alike), and adds a table of the two blocks side by side.
Every process writes its byte code under one folder (`PYTHONPYCACHEPREFIX`, filled by an
untimed first process), so that no mode pays for compiling Python sources: a user's
installed package has its `.pyc` files.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODES = ("pc-cold", "pc-warm", "pc-nochip", "tpu", "tpu-races", "hlo")
SUITE_MODES = ("pc-cold", "pc-warm", "tpu", "tpu-races", "hlo")
PARTS = ("call", "lower", "suite")
TARGET = 2.0


# -- the worker: one (kernel, mode, part) in this process --------------------------------

def worker(kernel: str, mode: str, part: str) -> dict[str, Any]:
    started = time.perf_counter()
    import jax
    import numpy as np

    import pallas_check
    import pallas_check.api  # noqa: F401 (what the plugin imports at its start)

    sys.path.insert(0, str(HERE))
    from _first_call_kernels import KERNELS, interpret_for

    fn, args, reference = KERNELS[kernel](interpret_for(mode))
    jax.block_until_ready(args)
    result: dict[str, Any] = {"import_and_inputs": time.perf_counter() - started}

    def first() -> Any:
        if part == "lower":
            return jax.jit(lambda *a: fn(*a) * 2).lower(*args).as_text()
        return jax.block_until_ready(fn(*args))

    begun = time.perf_counter()
    if mode.startswith("pc"):
        options = {"chip_compile": False} if mode == "pc-nochip" else {}
        with pallas_check.checking(project=False, **options) as run:
            entered = time.perf_counter()
            out = first()
            done = time.perf_counter()
        result["block"] = time.perf_counter() - begun
        result["findings"] = len(run.findings)
        result["tiers"] = [call.tier for call in run.calls]
    else:
        entered = time.perf_counter()
        out = first()
        done = time.perf_counter()
    result["first"] = done - entered
    if part == "call":
        np.testing.assert_allclose(np.asarray(out), np.asarray(reference(*args)),
                                   rtol=1e-5, atol=1e-5)
    else:
        assert "func" in out
    return result


# -- the driver --------------------------------------------------------------------------

def child_env(cache: str, pycache: str, tree: Path = HERE.parent) -> dict[str, str]:
    """A worker's environment: `tree`'s pallas_check first on the path, none of
    pallas-check's variables but its cache folder, byte code kept under `pycache`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PALLAS_CHECK_") and k != "PYTHONDONTWRITEBYTECODE"}
    env["PALLAS_CHECK_CACHE_DIR"] = cache
    env["PYTHONPYCACHEPREFIX"] = pycache
    env["PYTHONPATH"] = os.pathsep.join(
        [str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def run_worker(kernel: str, mode: str, part: str, cache: str, pycache: str,
               tree: Path = HERE.parent) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "result.json"
        proc = subprocess.run(
            [sys.executable, __file__, "--worker", kernel, mode, part, str(out)],
            env=child_env(cache, pycache, tree), capture_output=True, text=True,
            timeout=600)
        if proc.returncode != 0 or not out.exists():
            raise SystemExit(f"{kernel} {mode} {part} failed:\n{proc.stderr[-3000:]}")
        return json.loads(out.read_text())


def _runs(against: Path | None) -> list[tuple[str, Path]]:
    """(label, tree) of each mode's runs: this tree's, and `against`'s pallas-check modes
    labelled `base:MODE`, each right after this tree's run of the same mode."""
    runs = []
    for mode in MODES:
        runs.append((mode, HERE.parent))
        if against is not None and mode.startswith("pc"):
            runs.append((f"base:{mode}", against))
    return runs


def fresh_processes(parts: list[str], kernels: list[str], rounds: int, pycache: str,
                    scratch: Path, against: Path | None = None) -> dict[str, Any]:
    """results[part][kernel][mode] = list of worker results, rounds interleaved."""
    results: dict[str, Any] = {}
    for r in range(rounds):
        for part in parts:
            for kernel in kernels:
                for label, tree in _runs(against):
                    mode = label.split(":")[-1]
                    side = "base" if label.startswith("base:") else "tree"
                    # pc-nochip: cold, in a folder of its own.
                    cache = scratch / f"cache-{side}-{part}-{kernel}-{r}"
                    where = str(cache.with_name(cache.name + "-nochip")
                                if mode == "pc-nochip" else cache)
                    found = run_worker(kernel, mode, part, where, pycache, tree)
                    results.setdefault(part, {}).setdefault(kernel, {}).setdefault(
                        label, []).append(found)
                    print(f"round {r + 1} {part} {kernel} {label}: first"
                          f" {found['first']:.3f} s"
                          + (f", block {found['block']:.3f} s" if "block" in found else ""),
                          file=sys.stderr)
    return results


SUITE_TEST = '''
import sys

import jax
import numpy as np
import pytest

sys.path.insert(0, {here!r})
from _first_call_kernels import KERNELS, interpret_for

MODE = {mode!r}


@pytest.mark.parametrize("name", list(KERNELS))
def test_call(name):
    fn, args, reference = KERNELS[name](interpret_for(MODE))
    out = fn(*args)
    np.testing.assert_allclose(np.asarray(out), np.asarray(reference(*args)),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", list(KERNELS))
def test_lower(name):
    """As a suite's donation and signature tests do: inputs drawn with jax.random, the
    jitted function lowered and its text read, never called."""
    fn, args, _ = KERNELS[name](interpret_for(MODE))
    keys = jax.random.split(jax.random.key(0), len(args))
    args = [jax.random.normal(k, a.shape, a.dtype) if a.dtype == np.float32 else a
            for k, a in zip(keys, args)]
    assert "func" in jax.jit(lambda *a: fn(*a) * 2).lower(*args).as_text()
'''


def suite(mode: str, cache: str, pycache: str, scratch: Path, tree: Path = HERE.parent
          ) -> dict[str, float]:
    """Each test's time (setup, call and teardown) in one pytest process."""
    folder = scratch / f"suite-{mode}-{abs(hash(str(tree)))}"
    folder.mkdir(exist_ok=True)
    (folder / "test_small_kernels.py").write_text(SUITE_TEST.format(here=str(HERE),
                                                                    mode=mode))
    junit = folder / "junit.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               f"--junitxml={junit}", str(folder / "test_small_kernels.py")]
    if mode.startswith("pc"):
        command.append("--pallas-check")
    begun = time.perf_counter()
    proc = subprocess.run(command, cwd=folder, env=child_env(cache, pycache, tree),
                          capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - begun
    if proc.returncode != 0:
        raise SystemExit(f"suite {mode} failed:\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
    times = {case.get("name", "?"): float(case.get("time", "nan"))
             for case in ElementTree.parse(junit).iter("testcase")}
    times["(process)"] = wall
    return times


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _cell(runs: list[dict[str, Any]]) -> str:
    first = _median([r["first"] for r in runs])
    if "block" not in runs[0]:
        return f"{first:.2f}"
    return f"{first:.2f} / {_median([r['block'] for r in runs]):.2f}"


def _block(runs: list[dict[str, Any]]) -> float:
    return _median([r["block"] for r in runs])


def fresh_tables(results: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for part, title in (("call", "First call, fresh process"),
                        ("lower", "`jax.jit(f).lower(x).as_text()`, fresh process")):
        if part not in results:
            continue
        lines += [f"{title} (median s; pc: the call / the whole `checking()` block)", "",
                  "| kernel | pc cold | pc warm | pc no chip | TPU interp | TPU races | HLO |"
                  " pc cold / TPU | pc warm / TPU |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for kernel, modes in results[part].items():
            tpu = _median([r["first"] for r in modes["tpu"]])
            lines.append(f"| {kernel} | " + " | ".join(_cell(modes[m]) for m in MODES)
                         + f" | {_block(modes['pc-cold']) / tpu:.2f}x"
                         f" | {_block(modes['pc-warm']) / tpu:.2f}x |")
        lines.append("")
        if not any(k.startswith("base:") for k in next(iter(results[part].values()))):
            continue
        lines += [f"{title}: the `checking()` block, base -> this tree (median s)", "",
                  "| kernel | " + " | ".join(m for m in MODES if m.startswith("pc")) + " |",
                  "|---|" + "---:|" * sum(m.startswith("pc") for m in MODES)]
        for kernel, modes in results[part].items():
            cells = [f"{_block(modes['base:' + m]):.2f} -> {_block(modes[m]):.2f}"
                     for m in MODES if m.startswith("pc")]
            lines.append(f"| {kernel} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def suite_table(suites: dict[str, dict[str, float]]) -> list[str]:
    if not suites:
        return []
    names = [n for n in next(iter(suites.values())) if n != "(process)"]
    lines = ["pytest file, each test's time (s, setup + call + teardown)", "",
             "| test | " + " | ".join(suites) + " |", "|---|" + "---:|" * len(suites)]
    for name in [*names, "(process)"]:
        lines.append(f"| {name} | " + " | ".join(
            f"{suites[m].get(name, float('nan')):.2f}" for m in suites) + " |")
    return [*lines, ""]


def tables(results: dict[str, Any], suites: dict[str, dict[str, float]]) -> str:
    return "\n".join([f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python"
                      f" {platform.python_version()}", "", *fresh_tables(results),
                      *suite_table(suites)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--kernels", default="elementwise,reduction,matmul,prefetch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--against", type=Path, help="another checkout's root, paired")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--worker", nargs=4, metavar=("KERNEL", "MODE", "PART", "OUT"))
    args = parser.parse_args()
    if args.worker:
        kernel, mode, part, out = args.worker
        Path(out).write_text(json.dumps(worker(kernel, mode, part)))
        return
    parts = args.parts.split(",")
    kernels = args.kernels.split(",")
    trees = [("", HERE.parent)] + ([("base:", args.against)] if args.against else [])
    with tempfile.TemporaryDirectory(prefix="first-call-") as scratch_name:
        scratch = Path(scratch_name)
        pycache = str(scratch / "pycache")
        for mode in ("pc-cold", "tpu", "hlo"):  # byte code of every mode's path, untimed
            for _, tree in trees:
                run_worker(kernels[0], mode, "call", str(scratch / "untimed"), pycache, tree)
        results = fresh_processes([p for p in parts if p != "suite"], kernels, args.rounds,
                                  pycache, scratch, args.against)
        suites: dict[str, dict[str, float]] = {}
        if "suite" in parts:
            for mode in SUITE_MODES:
                for label, tree in trees:
                    if label and not mode.startswith("pc"):
                        continue
                    cache = str(scratch / f"suite-cache-{label or 'tree'}")
                    suites[label + mode] = suite(mode, cache, pycache, scratch, tree)
    text = tables(results, suites)
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"fresh": results, "suite": suites}, indent=1))


if __name__ == "__main__":
    main()
