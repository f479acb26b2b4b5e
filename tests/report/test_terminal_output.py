"""What a person sees (issue 15, item 6): the table at the terminal's width, one-line
errors, `--format text`, ASCII where stdout cannot draw, typos in variables caught."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from pallas_check.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "samples"


def run(*args: str, env: dict | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "pallas_check", *args], capture_output=True,
                          text=True, cwd=cwd, env=full_env, timeout=300)


def test_columns_80_gives_blocks_no_line_wider_than_the_terminal():
    # Issue 26 item 10: a block per finding whose headline is `path:line: kind: message`
    # (the old block's `#1 path:line  kernel (call 0)  buffer` heading is gone).
    result = run("run", "samples/oob_load_bug.py", env={"COLUMNS": "80"})
    assert result.returncode == 1
    assert all(len(line) <= 80 for line in result.stdout.splitlines())
    lines = result.stdout.splitlines()
    assert "samples/oob_load_bug.py:21: out-of-bounds: load of x_ref[8:16, 0:128] is out" in (
        lines)
    assert "    kernel scale_kernel (call 0), buffer x_ref[8:16, 0:128] (VMEM)," in lines
    assert "    grid point (1,)" in lines
    assert "    called from samples/oob_load_bug.py:26: return pl.pallas_call(" in lines
    assert "    note: replay: pallas-check run samples/oob_load_bug.py --seed 0" in lines


def test_a_wide_table_keeps_paths_and_a_short_kernel_name_whole(tmp_path):
    script = tmp_path / "k.py"
    script.write_text((SAMPLES / "oob_load_bug.py").read_text().replace("scale_kernel", "k"))
    result = run("run", str(script), env={"COLUMNS": "140"}, cwd=tmp_path)
    result_stdout = result.stdout.replace(f"run {script} ", "run k.py ")  # as typed
    assert result.returncode == 1
    assert "┃ kernel " in result.stdout  # the header is not printed letter by letter
    assert "k.py:21" in result.stdout
    assert str(tmp_path) not in result_stdout  # file:line and messages: relative paths


def test_ascii_stdout_gets_ascii_boxes_and_a_report():
    result = run("run", "samples/oob_load_bug.py",
                 env={"PYTHONIOENCODING": "ascii", "COLUMNS": "140"})
    assert result.returncode == 1, result.stderr
    assert "+---" in result.stdout and "pallas-check: 1 finding in 1 pallas_call" in (
        result.stdout)


def test_text_format_is_one_line_per_finding():
    # Issue 26 item 12: each finding is followed by its replay command as a `note:` line
    # (as compilers add notes), and the report ends with the summary line.
    result = run("run", "samples/oob_load_bug.py", "--format", "text")
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        "samples/oob_load_bug.py:21:9: out-of-bounds: scale_kernel [x_ref[8:16, 0:128]]: load"
        " of x_ref[8:16, 0:128] is out of bounds of x_ref (shape [8, 128]): index 8:16 in"
        " dimension 0 of size 8 (x3)",
        "samples/oob_load_bug.py:21:9: note: replay: pallas-check run samples/oob_load_bug.py"
        " --seed 0",
        "pallas-check: 1 finding in 1 pallas_call"]
    assert "oob_load_bug: last row" in result.stderr  # the script's print


def test_usage_errors_are_one_line():
    for args in (["run", "--dma", "sometimes", "samples/add_ok.py"], ["rnu", "x"],
                 ["run", "samples/add_ok.py", "--format", "xml"]):
        result = run(*args)
        assert result.returncode == 2
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert result.stderr.startswith("pallas-check: error: ")


def test_help_lists_the_choices():
    result = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "200"})
    assert "eager|on_wait|random" in result.output
    assert "table|json|sarif|text" in result.output


def test_a_typo_in_a_variable_is_an_error_naming_the_right_one():
    result = run("run", "samples/add_ok.py", env={"PALLAS_CHECK_DMAA": "eager"})
    assert result.returncode == 2
    assert result.stderr.strip() .startswith(
        "pallas-check: error: unknown environment variable PALLAS_CHECK_DMAA; did you mean"
        " PALLAS_CHECK_DMA?")


def test_a_second_double_dash_reaches_the_script(tmp_path):
    script = tmp_path / "args.py"
    script.write_text("import sys\nprint(sys.argv[1:])\n")
    result = run("run", str(script), "--", "--", "a", cwd=tmp_path)
    assert result.stdout.splitlines()[0] == "['--', 'a']"


def test_a_gather_from_a_ref_is_a_compile_error_like_on_tpu(tmp_path):
    script = tmp_path / "gather.py"
    script.write_text(
        "import jax, jax.numpy as jnp\n"
        "from jax.experimental import pallas as pl\n"
        "def k(idx_ref, x_ref, o_ref):\n"
        "    o_ref[...] = x_ref[idx_ref[...], :]\n"
        "x = jnp.zeros((8, 128))\n"
        "pl.pallas_call(k, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))(\n"
        "    jnp.arange(8, dtype=jnp.int32), x)\n")
    result = run("run", str(script), cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "TPU compile errors (1)" in result.stdout
    assert "gather.py:4" in result.stdout and "x_ref" in result.stdout
    assert "pallas-check error" not in result.stderr


def test_long_internal_errors_are_cut_to_one_short_line(monkeypatch):
    from pallas_check.run.runner import MAX_ERROR_CHARS, short_error

    monkeypatch.delenv("PALLAS_CHECK_DEBUG", raising=False)
    message = "JAX failed:\n" + "module @x { ... }\n" * 500
    line = short_error(message)
    assert "\n" not in line and len(line) < MAX_ERROR_CHARS + 60
    assert line.endswith("(PALLAS_CHECK_DEBUG=1 shows the rest)")
    monkeypatch.setenv("PALLAS_CHECK_DEBUG", "1")
    assert len(short_error(message)) > 5000


def test_keep_going_says_in_how_many_schedules_a_finding_appeared():
    result = run("run", "samples/shared_sem_bug.py", "--dma", "random", "--races",
                 "--schedules", "6", "--keep-going", "--format", "json")
    data = json.loads(result.stdout)
    counts = {tuple(f["details"]["schedules"]) for f in data["findings"]}
    assert counts and all(total == 6 and 1 <= seen <= 6 for seen, total in counts)
