"""Suite row (issue 38): pallas-check next to JAX's interpreters on cold calls, one fresh
process per case and mode.

    python benchmarks/suite.py                                  # every case, every mode
    python benchmarks/suite.py --only add_ok,case_flash --cap 120 --json suite.json
    python benchmarks/suite.py --modes pc,tpu-interp            # leave the HLO column out

Why: benchmarks/run.py times the *second* call of a few kernels (the steady state). A
test suite mostly pays *first* calls: every sample and test builds its kernels once. This
row runs each `samples/*_ok.py` and each `tests/shipped_kernels/case_*.py` as a script,
once per mode, each in a process of its own (benchmarks/_suite_one.py), and times the
script's run (`runpy.run_path`, after `import jax` and the mode's setup): tracing,
lowering, compiling, checking, the script's own numpy reference and output check.

Modes: `pc` (pallas-check, races on), `tpu-interp` (JAX's TPU interpreter, races on),
`hlo` (JAX's HLO interpreter, `interpret=True`), `floor` (the script with every kernel call
answered from outputs an untimed `record` run of the TPU interpreter kept: the script's
own work, no kernel; each mode less the floor is what its kernels add). Cases run one
after the other, the modes of a case one after the other (interleaved, so that a drift of
the machine touches every mode alike). pallas-check's disk cache of its compiled programs
is off (cold); `--cache DIR` times a suite's next run instead (run twice with one DIR). A case that fails under a mode (raises, exits non-zero, runs past `--cap`,
or has an option pallas-check's API cannot take) is shown with that status and left out
of the totals, never hidden.

Target (issue 38): pallas-check's total at most 1/3 of the TPU interpreter's, and no case
slower under pallas-check than under the TPU interpreter. Both totals are printed: the
scripts' whole times, and what the kernels add over the floor.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).resolve().parent / "_suite_one.py"
PYTHON = sys.executable
MODES = ("pc", "tpu-interp", "hlo", "floor")
HEADERS = {"pc": "pc s", "tpu-interp": "TPU interp races s", "hlo": "HLO s",
           "floor": "floor s"}
TARGET_RATIO = 1 / 3
_DEVICE_FLAG = "--xla_force_host_platform_device_count"
# The shipped all_gather is run by tests/scenarios/test_shipped_kernels.py outside its
# IN_PROCESS list: on 4 devices; `eager` is the mode in which it is clean (on_wait finds
# its ring race) and the one in which JAX's interpreter runs it (see the case's docstring).
ALL_GATHER = ("all_gather", "--devices 4 --dma eager")


@dataclasses.dataclass(frozen=True)
class Case:
    """One script of the row and the `pallas-check run` options it is run with."""

    name: str
    path: Path
    options: str


def _tests_on_path() -> None:
    """The test modules hold the options each case needs: import them, not copies."""
    tests = str(REPO / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)


def sample_options(path: Path) -> str:
    """A sample's options from its docstring's `Run:` line (run_args). run_args takes the
    first word after `run` as the path; a line that puts options first (nested_pipeline_ok:
    `run --races samples/...`) is read again here with the path dropped."""
    _tests_on_path()
    from scenarios.test_samples import run_args

    options = run_args(path)
    if not any(word.endswith(".py") for word in options.split()):
        return options
    match = re.search(r"^Run: pallas-check run (.*)$", path.read_text(), re.MULTILINE)
    words = match.group(1).split() if match else []
    return " ".join(word for word in words if not word.endswith(".py"))


def shipped_cases() -> list[Case]:
    """JAX's shipped kernels with the options test_shipped_kernels.py runs them with."""
    _tests_on_path()
    from scenarios.test_shipped_kernels import CASES, IN_PROCESS

    pairs = [(name, " ".join(options)) for name, options in IN_PROCESS] + [ALL_GATHER]
    return [Case(f"case_{name}", CASES / f"case_{name}.py", options)
            for name, options in sorted(pairs)]


def all_cases(only: list[str]) -> list[Case]:
    """Every `_ok` sample, then every shipped kernel, keeping those whose name has one of
    the `only` substrings (all of them when `only` is empty). A substring that is a
    case's whole name selects that case alone (`add_ok` is not also `sc_atomic_add_ok`)."""
    samples = [Case(p.stem, p, sample_options(p))
               for p in sorted((REPO / "samples").glob("*_ok.py"))]
    cases = samples + shipped_cases()
    names = {c.name for c in cases}

    def wanted(name: str) -> bool:
        return any(s == name if s in names else s in name for s in only)

    return [c for c in cases if not only or wanted(c.name)]


def child_env(options: str, cache: str = "off") -> dict[str, str]:
    """The worker's environment: XLA_FLAGS asks for the case's `--devices` CPU devices
    before JAX starts (any inherited device count removed); the shipped cases' own
    interpreter switches and pallas-check's variables removed, so that only the mode
    decides how the script runs."""
    if str(WORKER.parent) not in sys.path:
        sys.path.insert(0, str(WORKER.parent))
    from _suite_one import api_options

    _keywords, devices, _skip = api_options(options)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CASE_", "PALLAS_CHECK_"))}
    # Cold by default: no compiled program of pallas-check's read back from disk.
    env["PALLAS_CHECK_CACHE_DIR"] = cache
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(_DEVICE_FLAG)]
    if devices > 1:
        flags.append(f"{_DEVICE_FLAG}={devices}")
    env["XLA_FLAGS"] = " ".join(flags)
    return env


def _tail(text: str, limit: int = 200) -> str:
    """The last non-empty line of a process's output, shortened."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    last = lines[-1].strip() if lines else ""
    return last if len(last) <= limit else "..." + last[-limit + 3:]


def run_one(case: Case, mode: str, cap: float, recording: Path | None = None,
            cache: str = "off") -> dict[str, Any]:
    """The case under the mode in a fresh worker process, killed after `cap` seconds
    (`recording`: the file `record` writes and `floor` reads). The result always has
    `status`: ok, error, skipped, timeout or `exit N`."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        argv = [PYTHON, str(WORKER), "--mode", mode, "--case", case.name,
                "--path", str(case.path), f"--options={case.options}", "--out", str(out)]
        if recording is not None:
            argv += ["--recording", str(recording)]
        start = time.perf_counter()
        try:
            proc = subprocess.run(argv, cwd=REPO, env=child_env(case.options, cache),
                                  capture_output=True, text=True, timeout=cap)
        except subprocess.TimeoutExpired:
            return {"case": case.name, "mode": mode, "seconds": None, "ok": False,
                    "error": f"timeout: killed after {cap:g} s", "status": "timeout",
                    "options": case.options, "process_seconds": cap}
        elapsed = time.perf_counter() - start
        result = json.loads(out.read_text()) if out.exists() else None
    if result is None or proc.returncode != 0:
        error = _tail(proc.stderr) or _tail(proc.stdout) or "no result"
        return {"case": case.name, "mode": mode, "seconds": None, "ok": False,
                "error": error, "status": f"exit {proc.returncode}",
                "options": case.options, "process_seconds": elapsed}
    result["status"] = ("ok" if result["ok"] else
                        "skipped" if result.get("skipped") else "error")
    result["process_seconds"] = elapsed
    return result


def _unrecorded(case: Case, record: dict[str, Any]) -> dict[str, Any]:
    """The floor of a case whose outputs could not be recorded (the TPU interpreter does
    not run it): not run, with the recording's error."""
    return {"case": case.name, "mode": "floor", "seconds": None, "ok": False,
            "error": f"not recorded: {record['error']}", "status": "skipped",
            "options": case.options, "process_seconds": 0.0}


def cell(result: dict[str, Any] | None) -> str:
    """A table cell: seconds, with `!N` where pallas-check had N findings, or the status."""
    if result is None:
        return "-"
    if result["status"] != "ok":
        return result["status"]
    text = f"{result['seconds']:.2f}"
    return text + f" !{result['findings']}" if result.get("findings") else text


def _ratio(a: dict[str, Any] | None, b: dict[str, Any] | None) -> str:
    if a is None or b is None or a["status"] != "ok" or b["status"] != "ok":
        return "-"
    return f"{a['seconds'] / b['seconds']:.2f}x" if b["seconds"] > 0 else "-"


def _over_floor(pc: dict[str, Any] | None, tpu: dict[str, Any] | None,
                floor: dict[str, Any] | None) -> str:
    """What pallas-check adds to the script over what the TPU interpreter adds, each
    mode's time less the floor's (the script with no kernel run)."""
    if any(r is None or r["status"] != "ok" for r in (pc, tpu, floor)):
        return "-"
    assert pc is not None and tpu is not None and floor is not None
    added = tpu["seconds"] - floor["seconds"]
    return f"{(pc['seconds'] - floor['seconds']) / added:.2f}x" if added > 0 else "-"


def table(cases: list[Case], results: dict[tuple[str, str], dict[str, Any]],
          modes: tuple[str, ...]) -> list[str]:
    """The row's table as text lines: case, each mode's seconds, pc/TPU, pc/HLO."""
    header = ["case", *(HEADERS[m] for m in modes), "pc/TPU", "pc/HLO", "over floor pc/TPU"]
    rows = [header]
    for case in cases:
        got = {m: results.get((case.name, m)) for m in MODES}
        rows.append([case.name, *(cell(got[m]) for m in modes),
                     _ratio(got["pc"], got["tpu-interp"]), _ratio(got["pc"], got["hlo"]),
                     _over_floor(got["pc"], got["tpu-interp"], got["floor"])])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [" | ".join(v.ljust(w) if i == 0 else v.rjust(w)
                        for i, (v, w) in enumerate(zip(row, widths))) for row in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return lines


def _ok(results: dict[tuple[str, str], dict[str, Any]], name: str, mode: str) -> bool:
    result = results.get((name, mode))
    return result is not None and result["status"] == "ok"


def totals(cases: list[Case], results: dict[tuple[str, str], dict[str, Any]],
           modes: tuple[str, ...]) -> dict[str, Any]:
    """Totals over the cases every mode ran OK, and pallas-check against the TPU
    interpreter over the cases both ran OK (the target's comparison; a case the HLO
    interpreter cannot run still counts there)."""
    def total(names: list[str], mode: str) -> float:
        return sum(results[(n, mode)]["seconds"] for n in names)

    every = [c.name for c in cases if all(_ok(results, c.name, m) for m in modes)]
    out: dict[str, Any] = {"all_ok_cases": len(every),
                           "all_ok_seconds": {m: total(every, m) for m in modes}}
    if "pc" in modes and "tpu-interp" in modes:
        both = [c.name for c in cases if _ok(results, c.name, "pc")
                and _ok(results, c.name, "tpu-interp")]
        pc, tpu = total(both, "pc"), total(both, "tpu-interp")
        slower = [n for n in both if results[(n, "pc")]["seconds"]
                  > results[(n, "tpu-interp")]["seconds"]]
        out.update(pc_tpu_cases=len(both), pc_seconds=pc, tpu_seconds=tpu,
                   pc_over_tpu=pc / tpu if tpu else None, slower_than_tpu=slower)
        floored = [n for n in both if _ok(results, n, "floor")]
        if "floor" in modes and floored:
            floor = total(floored, "floor")
            pc_added = total(floored, "pc") - floor
            tpu_added = total(floored, "tpu-interp") - floor
            out.update(floor_cases=len(floored), floor_seconds=floor,
                       pc_added_seconds=pc_added, tpu_added_seconds=tpu_added,
                       pc_added_over_tpu_added=pc_added / tpu_added if tpu_added > 0 else None)
    return out


def summary(summed: dict[str, Any], modes: tuple[str, ...]) -> list[str]:
    """The totals as text lines, with the targets met or not."""
    seconds = ", ".join(f"{HEADERS[m].removesuffix(' s')} {s:.1f} s"
                        for m, s in summed["all_ok_seconds"].items())
    lines = [f"Cases every mode ran OK ({summed['all_ok_cases']}): {seconds}"]
    every = summed["all_ok_seconds"]
    if {"pc", "tpu-interp", "hlo"} <= set(every):
        # The scripts' own work (inputs, references, output checks) is in every column;
        # the HLO interpreter's time is about what running the script costs.
        lines.append(
            f"Over running it (HLO interpreter), same cases: pallas-check"
            f" {every['pc'] - every['hlo']:+.1f} s, TPU interpreter races"
            f" {every['tpu-interp'] - every['hlo']:+.1f} s")
    if "pc_tpu_cases" not in summed:
        return lines
    ratio = summed["pc_over_tpu"]
    verdict = "-" if ratio is None else ("met" if ratio <= TARGET_RATIO else "NOT met")
    slower = summed["slower_than_tpu"]
    lines += [
        f"pallas-check vs JAX TPU interpreter (races on), over the {summed['pc_tpu_cases']}"
        f" cases both ran OK: pallas-check {summed['pc_seconds']:.1f} s, TPU interpreter"
        f" {summed['tpu_seconds']:.1f} s, ratio "
        + (f"{ratio:.3f}" if ratio is not None else "-")
        + f" (target <= 0.333: {verdict})",
        f"Cases slower under pallas-check than under the TPU interpreter: {len(slower)}"
        f" (target 0){': ' + ', '.join(slower) if slower else ''}"]
    if "floor_cases" in summed:
        added = summed["pc_added_over_tpu_added"]
        lines.append(
            f"What running the kernels adds to the script (each mode less the floor, the"
            f" script with every kernel call answered from a recording), over the"
            f" {summed['floor_cases']} cases pc, TPU and floor ran OK: floor"
            f" {summed['floor_seconds']:.1f} s; pallas-check adds"
            f" {summed['pc_added_seconds']:.1f} s, TPU interpreter races"
            f" {summed['tpu_added_seconds']:.1f} s, ratio "
            + (f"{added:.3f}" if added is not None else "-")
            + f" (<= 0.333: {'-' if added is None else 'met' if added <= TARGET_RATIO else 'NOT met'})")
    return lines


def problems(results: list[dict[str, Any]]) -> list[str]:
    """Every result left out of the totals, and every pallas-check finding on a case
    (an `_ok` sample should have none), with its error text."""
    lines = []
    for r in results:
        if r["status"] != "ok":
            lines.append(f"  {r['case']} [{r['mode']}] {r['status']}: {r['error']}")
        elif r.get("findings"):
            lines.append(f"  {r['case']} [{r['mode']}] {r['findings']} finding(s)")
    return (["Not in the totals, or with findings:"] + lines) if lines else []


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="",
                        help="cases whose name has one of these substrings (comma-separated;"
                             " a case's whole name selects it alone)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--cap", type=float, default=300.0,
                        help="seconds a case's process may run under a mode (default 300)")
    parser.add_argument("--json", type=Path, help="also write every result here")
    parser.add_argument("--cache", default="off",
                        help="PALLAS_CHECK_CACHE_DIR for the workers (default off: cold; a"
                             " folder: a suite's next run reads back pallas-check's programs)")
    args = parser.parse_args()
    args.modes = tuple(m for m in args.modes.split(",") if m)
    unknown = set(args.modes) - set(MODES)
    if unknown or not args.modes:
        parser.error(f"--modes: unknown {sorted(unknown)} (of {', '.join(MODES)})")
    args.only = [s for s in args.only.split(",") if s]
    return args


def main() -> int:
    args = parse_args()
    cases = all_cases(args.only)
    if not cases:
        print(f"no case matches --only {','.join(args.only)}", file=sys.stderr)
        return 2
    results: dict[tuple[str, str], dict[str, Any]] = {}
    for i, case in enumerate(cases, 1):
        with tempfile.TemporaryDirectory() as tmp:
            recording = Path(tmp) / "outputs.pickle"
            steps = (("record",) if "floor" in args.modes else ()) + args.modes
            for mode in steps:
                result = (_unrecorded(case, results[(case.name, "record")])
                          if mode == "floor" and not _ok(results, case.name, "record")
                          else run_one(case, mode, args.cap,
                                       recording if mode in ("record", "floor") else None,
                                       args.cache))
                results[(case.name, mode)] = result
                print(f"[{i}/{len(cases)}] {case.name} {mode}: {cell(result)}"
                      f" ({result['process_seconds']:.1f} s in all)", file=sys.stderr,
                      flush=True)
    lines = table(cases, results, args.modes)
    summed = totals(cases, results, args.modes)
    print("\n".join(lines + [""] + summary(summed, args.modes)
                    + problems(list(results.values()))))
    if args.json is not None:
        args.json.write_text(json.dumps({
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                        "python": platform.python_version()},
            "modes": args.modes, "cap": args.cap,
            "cases": [dataclasses.asdict(c) | {"path": str(c.path)} for c in cases],
            "results": list(results.values()), "totals": summed}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
