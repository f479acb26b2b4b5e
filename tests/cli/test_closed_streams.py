"""A closed pipe is not our failure (issue 36, item 6): when the reader of the report stops
reading (`pallas-check run k.py | head -1`) or stdout is closed before the start (`>&-`),
the rest is dropped quietly and the run ends with its own exit code (here 1: the sample's
finding), never `internal error: BrokenPipeError` (exit 4), an AttributeError or a
traceback.

Real processes and real pipes: a pipe whose read end is closed before the run starts is
`| head -1` without its race (every write to it fails, however early).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pallas_check.config.exitcodes import ExitCode

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "samples" / "uninit_acc_bug.py"  # one finding: exit 1; prints a line
NO_CALL = "print('the script ran')\n"  # no pallas_call: exit 5


def _run_into_a_gone_reader(script: Path, args: list[str], streams: str) -> tuple[int, str]:
    """Run `pallas-check run SCRIPT ARGS` with `streams` ("stdout", or "stdout+stderr" as
    `2>&1 | head -1` has it) into a pipe nobody reads: its exit code and its stderr (empty
    when stderr went into that pipe too)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pallas_check", "run", str(script), *args],
            stdout=write_end, stderr=write_end if streams == "stdout+stderr" else subprocess.PIPE,
            stdin=subprocess.DEVNULL, cwd=ROOT, timeout=300)
    finally:
        os.close(write_end)
    return proc.returncode, (proc.stderr or b"").decode()


def _assert_quiet(stderr: str) -> None:
    for noise in ("Traceback", "internal error", "BrokenPipeError", "Exception ignored"):
        assert noise not in stderr, stderr


def test_a_reader_that_stopped_reading_leaves_the_runs_own_exit_code():
    """`pallas-check run k.py | head -1`: the script's print and the table go nowhere."""
    code, stderr = _run_into_a_gone_reader(SAMPLE, [], "stdout")
    assert code == ExitCode.FINDINGS, stderr
    _assert_quiet(stderr)


@pytest.mark.parametrize("args, streams", [
    (["--format", "json", "-o", "/dev/stdout"], "stdout"),  # a report through descriptor 1
    ([], "stdout+stderr"),  # `2>&1 | head -1`: our stderr lines go nowhere too
], ids=["report-to-dev-stdout", "stderr-too"])
def test_no_call_into_a_gone_reader_is_still_exit_5(tmp_path, args, streams):
    """(No pallas_call: a run's own code that no Python failure exits with: an uncaught
    BrokenPipeError whose traceback cannot be written ends Python with 1.)"""
    script = tmp_path / "s.py"
    script.write_text(NO_CALL)
    code, stderr = _run_into_a_gone_reader(script, args, streams)
    assert code == ExitCode.NO_CALLS, stderr
    _assert_quiet(stderr)


def test_a_closed_stdout_leaves_the_runs_own_exit_code(tmp_path):
    """`>&-`: Python starts with sys.stdout None; nothing is written, nothing fails."""
    script = tmp_path / "s.py"
    script.write_text(NO_CALL)
    proc = subprocess.run(["sh", "-c", f'"{sys.executable}" -m pallas_check run'
                                       f' "{script}" >&-'],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    assert proc.returncode == ExitCode.NO_CALLS, proc.stderr
    _assert_quiet(proc.stderr)
    assert "AttributeError" not in proc.stderr


def test_the_scripts_streams_outlive_the_run_for_a_print_still_going_on_another_thread():
    """A host callback of a computation the user stopped may still be inside `print` on an
    XLA thread when the run puts `sys.stdout` back; `print` holds that stream without a
    reference of its own, so the stream must stay alive (it was freed: SIGSEGV, seen in
    test_never_hang's Ctrl-C test under load)."""
    import gc
    import weakref

    from pallas_check.deliver.delivery import script_streams

    with script_streams("table", None):
        made = weakref.ref(sys.stdout), weakref.ref(sys.stderr)
    gc.collect()
    assert sys.stdout is not made[0]() and made[0]() is not None
    assert made[1]() is not None
