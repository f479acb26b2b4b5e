"""Every sample in samples/ through the real CLI: bugs give their stated finding, fixes none.

A buggy sample (`*_bug.py`) states what pallas-check must report in its docstring:

    Expected finding: kind=out-of-bounds buffer=x_ref range=[8:16, 0:128] line=23

`kind` is the finding kind's JSON name, `buffer` the kernel's own parameter name,
`range` the index range as the report prints it (omitted only where a sample says why),
`line` the line of the sample the finding points at (its first source frame), and the
optional `args` the CLI options the finding needs (e.g. `args=--dma on_wait`), given
last on the line; `generation` (the TPU generation of a `--compile` finding) goes before
`args`. Each `*_bug.py` has a fixed `*_ok.py` that must report nothing.
"""

from __future__ import annotations

import re
from pathlib import Path

import jax
import pytest

from pallas_check.findings.finding import FindingKind, format_range
from pallas_check.jaxbridge.version import compiled_tier_refusal

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
BUGS = sorted(SAMPLES.glob("*_bug.py"))
OKS = sorted(SAMPLES.glob("*_ok.py"))

_LINE = re.compile(r"^\s*Expected finding:\s*(.*)$", re.MULTILINE)
_FIELD = re.compile(r"(\w+)=(\[[^\]]*\]|.*?)(?=\s+\w+=|\s*$)")
_KNOWN_FIELDS = {"kind", "buffer", "range", "line", "args", "generation"}


def expectations(path: Path) -> list[dict[str, str]]:
    """The `Expected finding:` lines of a sample's header docstring, as field dicts."""
    text = path.read_text()
    docstring = text.split('"""')[1] if text.lstrip().startswith('"""') else ""
    out = []
    for body in _LINE.findall(docstring):
        fields = dict(_FIELD.findall(body.strip()))
        unknown = set(fields) - _KNOWN_FIELDS
        assert not unknown, f"{path.name}: unknown fields {unknown}"
        assert {"kind", "buffer", "line"} <= set(fields), f"{path.name}: {body!r}"
        out.append(fields)
    return out


def _range_text(index_range: list | None) -> str:
    return format_range(tuple(tuple(r) for r in index_range) if index_range else None)


def _line(finding: dict) -> int | None:
    frames = finding["frames"]
    return frames[0]["line"] if frames else None


def _describe(findings: list[dict]) -> str:
    return "\n".join(
        f"  {f['kind']} buffer={f['buffer']} range={_range_text(f['index_range'])}"
        f" line={_line(f)}: {f['message']}" for f in findings) or "  (none)"


# Samples whose calls the compiled tier runs (pallas_check/compiled/; the ok samples of
# DMA and pipeline kernels, to keep the suite's time): they run here with
# `--tier compiled`, so that each bug sample's finding (kind, buffer, range, line, as its
# docstring states it and the engine found it) is still found when the compiled run comes
# first and hands the call to the engine, and each ok sample stays clean and its outputs
# match numpy when the compiled run's outputs are the call's. Every other sample runs as
# `auto` runs it (one call of a small kernel: the engine).
COMPILED = frozenset("""
    deadlock_bug dma_not_waited_bug dma_read_before_wait_bug dma_same_dst_bug
    group_combine_bug oob_block_bug oob_dma_bug oob_load_bug oob_store_bug
    output_revisited_bug revisit_any_bug revisit_smem_cursor_bug semaphore_leak_bug
    stale_prefetch_bug uninit_acc_bug uninit_masked_bug unwritten_grid_bug unwritten_half_bug
    unwritten_padding_sliced_bug unwritten_select_bug vmem_capacity_bug vmem_headroom_bug
    add_ok deadlock_ok dma_not_waited_ok dma_read_before_wait_ok dma_same_dst_ok
    nested_pipeline_ok oob_dma_ok oob_load_ok semaphore_leak_ok stale_prefetch_ok
    unwritten_half_ok pack_elementwise_bug pack_elementwise_ok stochastic_round_ok
    stochastic_round_bug
""".split()) if compiled_tier_refusal(jax.__version__) is None else frozenset()
# (On a JAX the tier refuses, jax 0.9, `--tier compiled` would be a one-line refusal: the
# samples then run as `auto` runs them, all on the engine.)


def _run(cli, path: Path, args: str = ""):
    if path.stem in COMPILED:
        args = f"{args} --tier compiled"
    if "--devices" in args.split():
        return _run_subprocess(path, args)
    result = cli("run", *args.split(), str(path))
    if path.stem in COMPILED and result.report is not None:
        for call in result.report["calls"]:
            assert call["tier"] == "compiled" or call["reason"].startswith(
                ("the compiled run saw", "not run:")), (path.name, call["tier"], call["reason"])
    return result


def _run_subprocess(path: Path, args: str):
    """Several CPU devices need another process: XLA_FLAGS is read when JAX starts (a
    worker kept per device count, tests/_cli_worker.py)."""
    import json
    import tempfile
    from types import SimpleNamespace

    from _cli_worker import run_cli

    with tempfile.TemporaryDirectory() as tmp:
        report_path = Path(tmp) / "report.json"
        proc = run_cli(
            ["run", "--format", "json", "--output",
             str(report_path), *args.split(), str(path)],
            timeout=600)
        report = json.loads(report_path.read_text()) if report_path.exists() else None
    return SimpleNamespace(exit_code=proc.returncode, report=report,
                           output=proc.stdout + proc.stderr,
                           findings=report["findings"] if report else [])


def run_args(path: Path) -> str:
    """The options a sample's docstring says to run it with ("Run: pallas-check run X ...")."""
    match = re.search(r"^Run: pallas-check run \S+(.*)$", path.read_text(), re.MULTILINE)
    return match.group(1).strip() if match else ""


def _matches(finding: dict, want: dict[str, str], path: Path) -> bool:
    if finding["kind"] != want["kind"] or finding["buffer"] != want["buffer"]:
        return False
    if "range" in want and _range_text(finding["index_range"]) != want["range"]:
        return False
    if "generation" in want and finding["details"].get("generation") != want["generation"]:
        return False
    frames = finding["frames"]
    return bool(frames) and frames[0]["line"] == int(want["line"]) \
        and Path(frames[0]["file"]).resolve() == path.resolve()


def test_samples_are_paired_and_cover_every_kind():
    bug_stems = {p.name[: -len("_bug.py")] for p in BUGS}
    ok_stems = {p.name[: -len("_ok.py")] for p in OKS}
    assert bug_stems <= ok_stems, f"bug samples without a fix: {bug_stems - ok_stems}"
    kinds = {e["kind"] for p in BUGS for e in expectations(p)}
    wanted = {k.value for k in FindingKind} - {FindingKind.RACE.value}
    assert wanted <= kinds, f"no sample for {wanted - kinds}"
    for path in BUGS:
        assert expectations(path), f"{path.name} states no expected finding"


@pytest.mark.parametrize("path", BUGS, ids=lambda p: p.stem)
def test_bug_sample_reports_its_finding(cli, path):
    for want in expectations(path):
        result = _run(cli, path, want.get("args", ""))
        assert result.report is not None, result.output
        assert result.report["user_error"] is None, result.report["user_traceback"]
        assert result.report["internal_error"] is None, result.report["internal_error"]
        assert result.exit_code == 1, result.output
        findings = result.findings
        assert any(_matches(f, want, path) for f in findings), (
            f"{path.name}: expected {want}, got\n{_describe(findings)}")


@pytest.mark.parametrize("path", OKS, ids=lambda p: p.stem)
def test_ok_sample_is_clean(cli, path):
    result = _run(cli, path, run_args(path))
    assert result.report is not None, result.output
    assert result.report["user_error"] is None, result.report["user_traceback"]
    assert result.findings == [], _describe(result.findings)
    assert result.exit_code == 0
    assert "output matches" in result.output


# -- options that change what is found ------------------------------------------------------

def test_dma_mode_decides_read_before_wait(cli):
    """on_wait: the copy lands at the wait, so the early read sees never-written VMEM;
    eager: it landed at the start, so the same read sees the data: no never-written read,
    but the race checker (on by default) still finds the read unordered with the DMA's
    write; with --no-races nothing is found."""
    bug = SAMPLES / "dma_read_before_wait_bug.py"
    (want,) = expectations(bug)
    assert want["args"] == "--dma on_wait"
    on_wait = _run(cli, bug, "--dma on_wait")
    assert on_wait.exit_code == 1
    assert any(_matches(f, want, bug) for f in on_wait.findings), _describe(on_wait.findings)
    assert "matches reference: False" in on_wait.output
    eager = _run(cli, bug, "--dma eager")
    assert eager.exit_code == 1, _describe(eager.findings)
    race = {"kind": "race", "buffer": "buf", "range": "[0:8, 0:128]", "line": "25"}
    findings = eager.report["findings"]
    assert [f["kind"] for f in findings] == ["race"], _describe(findings)
    assert _matches(findings[0], race, bug), _describe(findings)
    assert "matches reference: True" in eager.output
    assert eager.report["config"]["dma_mode"] == "eager"
    off = _run(cli, bug, "--dma eager --no-races")
    assert off.exit_code == 0 and off.report["findings"] == [], off.output
    assert off.report["config"]["races"] is False


def test_a_stale_read_is_a_race_found_with_no_flag(cli):
    """The most common Pallas bug: a read of a DMA's destination before its wait, into a
    buffer that already holds data (zeroed at step 0, then an earlier step's block). No
    never-written memory is read, so only the race checker sees it: with no flag it runs
    and the run fails; with --no-races the wrong output passes unnoticed, and the summary
    says races were not checked."""
    bug = SAMPLES / "stale_prefetch_bug.py"
    (want,) = expectations(bug)
    assert "args" not in want
    result = cli("run", str(bug))
    assert result.exit_code == 1, result.output
    assert "matches reference: False" in result.output
    findings = result.report["findings"]
    assert {f["kind"] for f in findings} == {"race"}, _describe(findings)
    assert any(_matches(f, want, bug) for f in findings), _describe(findings)
    # ... and says how to fix it: the DMA's wait before the read (issue 36, item 2)
    first = next(f for f in findings if _matches(f, want, bug))
    assert first["help"] == ("wait for DMA #1 (`.wait()` on its descriptor) before the read"
                             " of buf at line 46, or read the other slot (a buffer no DMA in"
                             " flight is filling)"), first["help"]
    off = cli("run", "--format", "text", "--no-races", str(bug), json_report=False)
    assert off.exit_code == 0, off.output
    assert "matches reference: False" in off.output
    assert ("pallas-check: 0 findings in 1 pallas_call; races not checked"
            in off.output.splitlines()), off.output


@pytest.mark.parametrize("mode", ["eager", "on_wait"])
def test_dma_mode_independent_findings(cli, mode):
    """A DMA never waited on, or one past its array, is found whichever way DMAs land;
    the fixed DMA samples stay clean either way."""
    for name in ("dma_not_waited_bug.py", "oob_dma_bug.py"):
        path = SAMPLES / name
        (want,) = expectations(path)
        result = _run(cli, path, f"--dma {mode}")
        assert result.exit_code == 1
        assert any(_matches(f, want, path) for f in result.findings), _describe(result.findings)
    for name in ("dma_read_before_wait_ok.py", "dma_not_waited_ok.py"):
        result = _run(cli, SAMPLES / name, f"--dma {mode}")
        assert result.exit_code == 0 and result.findings == [], _describe(result.findings)


@pytest.mark.parametrize("mode", ["--dma on_wait", "--dma eager",
                                  "--dma random --schedules 20"])
def test_the_mxu_samples_under_every_dma_mode(cli, mode):
    """Explicit MXU operations (TPU v7): the double-buffered matmul stays clean and right,
    and its bug twin keeps exactly its two findings, however DMAs land, races checked."""
    ok = _run(cli, SAMPLES / "mxu_explicit_ok.py", f"--tpu v7x --races {mode}")
    assert ok.exit_code == 0 and ok.findings == [], _describe(ok.findings)
    assert "mxu_explicit_ok: output matches" in ok.output
    bug = SAMPLES / "mxu_explicit_bug.py"
    result = _run(cli, bug, f"--tpu v7x --races {mode}")
    assert result.exit_code == 1
    wants = expectations(bug)
    assert len(result.findings) == len(wants) == 2, _describe(result.findings)
    for want in wants:
        assert any(_matches(f, want, bug) for f in result.findings), _describe(result.findings)
    assert "mxu_explicit_bug: output matches" in result.output


@pytest.mark.parametrize("mode", ["--dma on_wait", "--dma eager",
                                  "--dma random --schedules 20"])
@pytest.mark.parametrize("name", ["stochastic_round", "stateful_random"])
def test_the_random_samples_under_every_dma_mode(cli, mode, name):
    """In-kernel random numbers: the ok twin stays clean and right, and the bug twin keeps
    exactly its one random-misuse finding, however DMAs land, races checked (as `auto`
    runs them: the compiled tier takes no --dma random)."""
    ok = cli("run", "--races", *mode.split(), str(SAMPLES / f"{name}_ok.py"))
    assert ok.exit_code == 0 and ok.findings == [], _describe(ok.findings)
    assert f"{name}_ok: output matches" in ok.output
    bug = SAMPLES / f"{name}_bug.py"
    result = cli("run", "--races", *mode.split(), str(bug))
    assert result.exit_code == 1
    (want,) = expectations(bug)
    assert len(result.findings) == 1, _describe(result.findings)
    assert _matches(result.findings[0], want, bug), _describe(result.findings)


CORE_OKS = ["core_handoff_ok.py", "core_map_race_ok.py", "core_signal_ok.py", "core_swap_ok.py",
            "matmul_2core_ok.py", "two_core_accumulate_ok.py"]


@pytest.mark.parametrize("mode", ["--dma on_wait", "--dma eager", "--dma random --schedules 20"])
@pytest.mark.parametrize("name", CORE_OKS)
def test_the_core_samples_under_every_dma_mode(cli, name, mode):
    """The samples of several TensorCores stay clean and right however DMAs land, races
    checked, on the chip their `Run:` line names (core_signal_ok and core_swap_ok: a v7x,
    two TensorCores; on the default v5e they hang, as the chip did: core_handoff_bug)."""
    path = SAMPLES / name
    result = _run(cli, path, f"{run_args(path)} --races {mode}")
    assert result.exit_code == 0 and result.findings == [], _describe(result.findings)
    assert "output matches" in result.output


@pytest.mark.parametrize("name", ["core_signal_ok.py", "core_swap_ok.py"])
def test_the_two_core_samples_hang_a_v5e(cli, name):
    """Without their `--tpu v7x` they run on the default v5e, whose one TensorCore hung on
    them (hardware/README.md, session 30): a deadlock at core 0's wait, with the help
    saying why; the script's own check of the output it never got fails too (exit 3)."""
    result = _run(cli, SAMPLES / name, "--races")
    assert result.exit_code == 3 and "AssertionError" in result.report["user_error"]
    (found,) = result.findings
    assert found["kind"] == "deadlock" and found["actor"] == "core 0", _describe([found])
    assert found["help"].startswith("a TPU v5e has one TensorCore: the 2 cores of the"
                                    " TensorCore mesh run one after another on it")


def test_uninit_fill_does_not_hide_a_missing_init(cli):
    """With --uninit zero the forgotten accumulator init happens to give the right answer;
    the finding must not depend on that luck (nor on the fill in the report)."""
    bug = SAMPLES / "uninit_acc_bug.py"
    (want,) = expectations(bug)
    runs = {fill: _run(cli, bug, f"--uninit {fill}") for fill in ("nan", "zero")}
    assert "matches reference: False" in runs["nan"].output
    assert "matches reference: True" in runs["zero"].output
    for fill, result in runs.items():
        assert result.exit_code == 1, fill
        assert result.report["config"]["uninit"] == fill
        assert any(_matches(f, want, bug) for f in result.findings), (
            f"--uninit {fill}:\n{_describe(result.findings)}")


@pytest.mark.parametrize("name", ["uninit_masked_ok.py", "uninit_padding_ok.py"])
def test_masked_away_reads_are_clean_under_both_fills(cli, name):
    """Reads of never-written memory whose values never reach an output are not findings."""
    result = _run(cli, SAMPLES / name, "--uninit zero")
    assert result.exit_code == 0 and result.findings == [], _describe(result.findings)


def test_deadlock_sample_ends_instead_of_hanging(tmp_path):
    """In its own process with a hard timeout, so a regression fails rather than hangs."""
    import json
    import subprocess
    import sys

    report = tmp_path / "deadlock.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pallas_check", "run", "--format", "json", "--output",
         str(report), str(SAMPLES / "deadlock_bug.py")],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    data = json.loads(report.read_text())
    # Found by the scheduler, not by a clock: the run finished (the watchdog would have
    # stopped a stuck one part way, with a partial report).
    assert data["partial"] is False and data["user_error"] is None
    kinds = [f["kind"] for f in data["findings"]]
    assert "deadlock" in kinds
