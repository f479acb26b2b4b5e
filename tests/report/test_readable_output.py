"""Output a person can read (issue 26, items 10-12): no squeezed cell and no split
location at any terminal width, colour on a terminal and none in pipes, `--format text`
with a replay note per finding and a summary line."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _pty import read_until_closed
from typer.testing import CliRunner

from pallas_check.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
WIDTHS = (80, 100, 110, 120, 140)
CASES = {
    "race": (("samples/dma_same_dst_bug.py", "--races"), "samples/dma_same_dst_bug.py",
             "samples/dma_same_dst_bug.py:27: race: "),
    "uninit": (("samples/dma_read_before_wait_bug.py",), "samples/dma_read_before_wait_bug.py",
               "samples/dma_read_before_wait_bug.py:25: uninitialized: "),
}
ESC = "\x1b["


@pytest.fixture(autouse=True)
def _plain_environment(monkeypatch):
    """Colour is decided by these variables: none set unless a test sets it."""
    for name in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(ROOT)


def _report(args: tuple[str, ...], width: int, env: dict | None = None) -> str:
    result = CliRunner().invoke(app, ["run", *args],
                                env={"COLUMNS": str(width), **(env or {})})
    assert result.exit_code == 1, result.output
    return result.output


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("case", CASES)
def test_no_cell_word_or_location_is_broken_at_any_width(case, width):
    args, file, head = CASES[case]
    out = _report(args, width)
    lines = out.splitlines()
    assert all(len(line.rstrip()) <= width for line in lines), out
    # Every mention of the file is whole and followed by its line: never `…/dma_same_d` at
    # the end of a line and `st_bug.py:27` at the start of the next.
    assert set(re.findall(r"samples/[\w.]*", out)) == {file}, out
    assert re.findall(rf"(?<!run ){re.escape(file)}(?!:\d)", out) == [], out
    assert not re.search(r"\(0\s*$", out, re.M), out  # the grid point (0,) is never split
    if "┃" in out:  # a table only where every column fits its content
        assert width >= 140
        assert "┃ grid point ┃" in out and "│ (0,) " in out
        assert f"│ {file}:" in out
    else:  # else one block per finding, headed `path:line: kind: message`
        assert width < 140
        assert [line for line in lines if line.startswith(head)], out
        assert "    kernel " in out and "grid point (0,)" in out
        assert f"    note: replay: pallas-check run {file}" in out
    assert lines[-1].startswith("pallas-check: ")


def test_wide_enough_terminals_get_the_table_with_every_column_whole():
    out = _report(CASES["race"][0], 160)
    header = next(line for line in out.splitlines() if line.startswith("┃ #"))
    assert [c.strip() for c in header.strip("┃").split("┃")] == [
        "#", "kernel", "buffer", "grid point", "where", "what", "count"]
    assert "│ 1 │ gather_add_kernel │ buf[0:8, 0:128] │ (0,)       │" \
           " samples/dma_same_dst_bug.py:27 │" in out


def _pty_run(*args: str, env: dict) -> str:
    """The CLI with its stdout on a pseudo-terminal (a TTY, as in a person's terminal)."""
    master, slave = pty.openpty()
    full = {k: v for k, v in os.environ.items()
            if k not in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")}
    proc = subprocess.Popen([sys.executable, "-m", "pallas_check", *args], cwd=ROOT,
                            stdout=slave, stderr=subprocess.DEVNULL,
                            env={**full, "TERM": "xterm-256color", "COLUMNS": "100", **env})
    os.close(slave)
    seen = read_until_closed(master, proc)
    assert proc.wait(timeout=300) == 1
    return seen.decode()


def test_a_terminal_gets_colours_and_no_color_turns_them_off():
    coloured = _pty_run("run", "samples/dma_read_before_wait_bug.py", env={})
    assert f"{ESC}36msamples/dma_read_before_wait_bug.py:25{ESC}0m" in coloured
    assert f"{ESC}1;31muninitialized{ESC}0m" in coloured
    plain = _pty_run("run", "samples/dma_read_before_wait_bug.py", env={"NO_COLOR": "1"})
    assert not re.search(r"\x1b\[[0-9;]*3[0-7]m", plain)  # no colour (bold may stay)
    assert "samples/dma_read_before_wait_bug.py:25: " in plain


def test_a_pipe_gets_no_styles_and_force_color_gets_them():
    piped = _report(CASES["uninit"][0], 120)
    assert ESC not in piped
    forced = _report(CASES["uninit"][0], 120, env={"FORCE_COLOR": "1"})
    assert f"{ESC}36msamples/dma_read_before_wait_bug.py:25{ESC}0m" in forced
    both = _report(CASES["uninit"][0], 120, env={"FORCE_COLOR": "1", "NO_COLOR": "1"})
    assert not re.search(r"\x1b\[[0-9;]*3[0-7]m", both)


def test_a_report_written_to_a_file_has_no_styles(tmp_path):
    out = tmp_path / "r.txt"
    result = CliRunner().invoke(app, ["run", "samples/dma_read_before_wait_bug.py", "-o",
                                      str(out)], env={"FORCE_COLOR": "1", "COLUMNS": "200"})
    assert result.exit_code == 1
    text = out.read_text()
    assert ESC not in text and "samples/dma_read_before_wait_bug.py:25: uninitialized: " in (
        text)  # a file is FILE_WIDTH (120) columns: blocks, whatever the terminal


def test_text_format_gives_a_replay_note_per_finding_and_a_summary():
    result = CliRunner().invoke(app, ["run", "samples/dma_read_before_wait_bug.py",
                                      "--format", "text", "--no-races"])
    assert result.exit_code == 1
    report = [line for line in result.stdout.splitlines()
              if not line.startswith("dma_read_before_wait_bug:")]  # the script's print
    assert report == [
        "samples/dma_read_before_wait_bug.py:25:9: uninitialized: load_kernel"
        " [buf[0:8, 0:128]]: 1024 elements of output o_ref[0:8, 0:128] depend on memory"
        " that was never written: read of buf[0:8, 0:128] at"
        " samples/dma_read_before_wait_bug.py:25 (the read comes before the wait of DMA #1,"
        " which fills buf: started at samples/dma_read_before_wait_bug.py:23 and waited at"
        " line 26, after the read) (kept by the program: result 0 of jax.jit(load_double)[0:8, 0:128], 1024"
        " elements)",
        "samples/dma_read_before_wait_bug.py:25:9: note: replay: pallas-check run"
        " samples/dma_read_before_wait_bug.py --no-races --seed 0",
        # How to fix it, after the note (issue 36): the DMA, its wait, the read.
        "samples/dma_read_before_wait_bug.py:25:9: help: DMA #1 (started at"
        " samples/dma_read_before_wait_bug.py:23) fills buf: move its wait (`copy.wait()`,"
        " line 26) before the read of buf at line 25, or read the other slot (a buffer no"
        " DMA in flight is filling)",
        "pallas-check: 1 finding in 1 pallas_call; races not checked"]


def test_text_format_of_a_clean_run_is_one_summary_line():
    proc = subprocess.run([sys.executable, "-m", "pallas_check", "run", "samples/add_ok.py",
                           "--format", "text"], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "pallas-check: 0 findings in 1 pallas_call\n"


def test_one_width_probe_columns_then_the_terminal_then_a_file(monkeypatch):
    from pallas_check.config.display import FILE_WIDTH, terminal_width

    monkeypatch.setenv("COLUMNS", "97")
    assert terminal_width() == 97
    monkeypatch.delenv("COLUMNS")
    monkeypatch.setattr(sys, "__stdout__", open(os.devnull, "w"))  # no terminal
    assert terminal_width() == FILE_WIDTH == 120


def test_paths_are_shown_relative_to_the_project_root(tmp_path, monkeypatch):
    from pallas_check.report.paths import display_path, display_text, project_root

    project = tmp_path / "proj"
    (project / "kernels").mkdir(parents=True)
    (project / "pyproject.toml").write_text("")
    script = project / "kernels" / "k.py"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # started from another folder: still the project's paths
    root = project_root(str(script))
    assert root == project
    assert display_path(str(script), root) == "kernels/k.py"
    assert display_path("/usr/lib/x.py", root) == "/usr/lib/x.py"
    assert display_text(f"DMA started at {script}:12 and at /usr/lib/x.py:3", root) == (
        "DMA started at kernels/k.py:12 and at /usr/lib/x.py:3")
    # no pyproject.toml: the git root; neither: the current folder
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "a").mkdir()
    assert project_root(str(repo / "a" / "k.py")) == repo
    assert project_root(str(tmp_path / "loose.py")) in (elsewhere, *tmp_path.parents)


@pytest.mark.parametrize("width", (80, 120, 200))
def test_diff_table_or_a_line_per_output_never_a_squeezed_cell(width):
    result = CliRunner().invoke(app, ["diff", "samples/dma_read_before_wait_bug.py",
                                      "--against", "hlo"], env={"COLUMNS": str(width)})
    assert result.exit_code == 1, result.output
    out = result.output
    assert all(len(line.rstrip()) <= width for line in out.splitlines()), out
    assert "samples/dma_read_before_wait_bug.py:19" in out
    if "┃" in out:
        assert width == 200 and "┃ mismatches   ┃ max abs ┃ max rel ┃" in out
        assert "│ 2048 of 2048 │" in out
    else:
        assert width < 200
        assert "samples/dma_read_before_wait_bug.py:19: call 0 load_kernel: output o_ref" in out
        assert "2048 of 2048" in out and "    [0, 1]: nan vs 2.0" in out


@pytest.mark.parametrize("width", (80, 200))
def test_compile_table_or_a_line_per_call_and_generation(width):
    result = CliRunner().invoke(app, ["compile", "samples/compile_alignment_bug.py", "--tpu",
                                      "v5e"], env={"COLUMNS": str(width)})
    assert result.exit_code == 1, result.output
    out = result.output
    assert all(len(line.rstrip()) <= width for line in out.splitlines()), out
    if width == 200:
        assert "┃ call ┃ kernel        ┃ where                               ┃" in out
        assert "│ samples/compile_alignment_bug.py:25 │ v5e │ compile-error E2003 │" in out
    else:
        assert "samples/compile_alignment_bug.py:25: call 0 window_kernel on v5e:" in out
    assert "samples/compile_alignment_bug.py:21: compile-error: window_kernel [x_ref]:" in out


def test_a_frames_column_is_shown_but_not_part_of_its_identity():
    from pallas_check.findings.finding import SourceFrame

    a = SourceFrame("k.py", 3, "k", "y = x[0] + x[1]", column=9)
    b = SourceFrame("k.py", 3, "k", "y = x[0] + x[1]", column=16)
    assert a == b and hash(a) == hash(b)  # two reads on one line still merge as one finding
