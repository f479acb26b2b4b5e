"""`[tool.pallas-check]` in pyproject.toml and `PALLAS_CHECK_*` variables.

Precedence: defaults < pyproject < environment < flags actually given. The end-to-end
tests run a script with no pallas_call (fast) and read the run's config from the JSON
report.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from pallas_check.cli.app import app, run
from pallas_check.config import DmaMode
from pallas_check.config.layers import (SettingsError, find_pyproject, load_settings,
                                        option_specs)
from pallas_check.config.exitcodes import ExitCode

EXPECTED_KEYS = {"dma", "uninit", "skip-floats", "format", "output", "devices", "tpu",
                 "cores", "seed", "races"}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    import os

    for name in list(os.environ):
        if name.startswith("PALLAS_CHECK_") and name != "PALLAS_CHECK_CACHE_DIR":
            monkeypatch.delenv(name)


def write_pyproject(folder: Path, table: str) -> Path:
    path = folder / "pyproject.toml"
    path.write_text("[project]\nname = 'kernels'\n\n[tool.pallas-check]\n"
                    + textwrap.dedent(table))
    return path


def invoke(*args: str):
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return result.exit_code, result.output + (getattr(result, "stderr", "") or "")


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A folder with a script making no pallas_call; the current directory."""
    (tmp_path / "s.py").write_text("print('script ran')\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_config(*flags: str) -> dict:
    """The config the JSON report of `run s.py FLAGS --format json -o r.json` shows."""
    code, output = invoke("run", "s.py", *flags, "--format", "json", "--output", "r.json")
    assert code == ExitCode.NO_CALLS, output  # s.py makes no pallas_call
    return json.loads(Path("r.json").read_text())["config"]


def test_every_run_option_is_a_key():
    specs = option_specs(run)
    assert EXPECTED_KEYS <= set(specs)
    # Every option of `run` (not its arguments) can be set: nothing is left out.
    command = typer.main.get_command(app).commands["run"]
    options = {p.name for p in command.params
               if any(o.startswith("--") for o in p.opts)}
    assert options == {s.name for s in specs.values()}
    assert {"--" + key for key in specs} <= {o for p in command.params for o in p.opts}
    assert specs["skip-floats"].env == "PALLAS_CHECK_SKIP_FLOATS"
    assert specs["format"].name == "fmt"


def test_table_values_and_key_spellings(tmp_path):
    path = write_pyproject(tmp_path, """\
        dma = "eager"
        skip_floats = true
        skip-floats-unused = 1
    """)
    with pytest.raises(SettingsError) as err:
        load_settings(run, cwd=tmp_path, environ={})
    assert "'skip-floats-unused'" in str(err.value) and str(path) in str(err.value)

    write_pyproject(tmp_path, """\
        dma = "eager"
        skip_floats = true
        uninit = "zero"
        tpu = "v6e"
        cores = 2
        seed = 5
        races = true
        format = "sarif"
        output = "reports/out.sarif"
        devices = 2
        scripts = ["a.py"]
        pattern = "kernels/*_check.py"
    """)
    sub = tmp_path / "kernels" / "deep"
    sub.mkdir(parents=True)
    settings = load_settings(run, cwd=sub, environ={})  # found from a subfolder
    assert settings.path == tmp_path / "pyproject.toml"
    assert settings.values == {
        "dma": "eager", "skip_floats": True, "uninit": "zero", "tpu": "v6e", "cores": 2,
        "seed": 5, "races": True, "fmt": "sarif",
        "output": str(tmp_path / "reports" / "out.sarif"), "devices": 2}
    assert settings.scripts == ["a.py"] and settings.patterns == ["kernels/*_check.py"]


def test_dash_and_underscore_both_accepted_but_not_twice(tmp_path):
    write_pyproject(tmp_path, 'skip-floats = true\n')
    assert load_settings(run, cwd=tmp_path, environ={}).values == {"skip_floats": True}
    write_pyproject(tmp_path, 'skip-floats = true\nskip_floats = false\n')
    with pytest.raises(SettingsError, match="twice"):
        load_settings(run, cwd=tmp_path, environ={})


@pytest.mark.parametrize("line, key", [
    ('dma = "later"', "dma"),
    ("devices = 0", "devices"),
    ("cores = 0", "cores"),
    ('format = "xml"', "format"),
    ('races = "yes"', "races"),
    ("seed = true", "seed"),
    ("seed = 1.5", "seed"),
    ("tpu = 5", "tpu"),
    ('output = ""', "output"),
    ("scripts = [1]", "scripts"),
    ("colour = true", "colour"),
])
def test_bad_values_name_key_and_file(tmp_path, line, key):
    path = write_pyproject(tmp_path, line + "\n")
    with pytest.raises(SettingsError) as err:
        load_settings(run, cwd=tmp_path, environ={})
    assert key in str(err.value) and str(path) in str(err.value)


def test_no_pyproject_or_no_table(tmp_path):
    if find_pyproject(tmp_path) is None:  # (unless some folder above tmp_path has one)
        settings = load_settings(run, cwd=tmp_path, environ={})
        assert settings.path is None and settings.values == {}
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    settings = load_settings(run, cwd=tmp_path, environ={})
    assert settings.path == tmp_path / "pyproject.toml"
    assert not settings.has_table and settings.values == {}


def test_environment_values(tmp_path):
    (tmp_path / "pyproject.toml").write_text("")
    settings = load_settings(run, cwd=tmp_path, environ={
        "PALLAS_CHECK_SKIP_FLOATS": "yes", "PALLAS_CHECK_SEED": "9",
        "PALLAS_CHECK_DMA": "eager", "PALLAS_CHECK_DEBUG": "1"})  # DEBUG is not an option
    assert settings.values == {"skip_floats": True, "seed": 9, "dma": "eager"}
    for name, value in [("PALLAS_CHECK_SEED", "x"), ("PALLAS_CHECK_RACES", "maybe"),
                        ("PALLAS_CHECK_TPU", "v9")]:
        with pytest.raises(SettingsError, match=name):
            load_settings(run, cwd=tmp_path, environ={name: value})


def test_precedence_end_to_end(project, monkeypatch):
    assert run_config()["dma_mode"] == "on_wait"  # no table: the default
    write_pyproject(project, 'dma = "eager"\nseed = 3\nskip_floats = true\n')
    config = run_config()
    assert config["dma_mode"] == "eager" and config["seed"] == 3 and config["skip_floats"]
    monkeypatch.setenv("PALLAS_CHECK_DMA", "on_wait")
    config = run_config()
    assert config["dma_mode"] == "on_wait" and config["seed"] == 3  # env over pyproject
    config = run_config("--dma", "eager", "--seed", "0")
    assert config["dma_mode"] == "eager" and config["seed"] == 0  # flags over both
    assert config["skip_floats"] is True  # a flag not given does not reset the table's


def test_format_and_output_from_pyproject(project):
    sub = project / "sub"
    sub.mkdir()
    write_pyproject(project, 'format = "json"\noutput = "reports/r.json"\n')
    (sub / "s.py").write_text("print('script ran')\n")
    import os

    os.chdir(sub)  # monkeypatch.chdir in `project` restores the directory afterwards
    code, output = invoke("run", "s.py")
    assert code == ExitCode.NO_CALLS, output
    report = json.loads((project / "reports" / "r.json").read_text())  # relative to the file
    assert report["schema"] == "pallas-check/report"


def test_cli_errors_exit_2_naming_key_and_file(project, monkeypatch):
    path = write_pyproject(project, 'dma = "sometimes"\n')
    code, output = invoke("run", "s.py")
    assert code == ExitCode.USAGE
    assert "dma" in output and str(path) in output and "Traceback" not in output
    write_pyproject(project, "speed = 3\n")
    code, output = invoke("run", "s.py", "--dma", "eager")  # a flag does not hide it
    assert code == ExitCode.USAGE and "'speed'" in output and str(path) in output
    path.write_text("[tool.pallas-check\n")
    code, output = invoke("run", "s.py")
    assert code == ExitCode.USAGE and str(path) in output and "TOML" in output
    write_pyproject(project, 'dma = "eager"\n')
    monkeypatch.setenv("PALLAS_CHECK_UNINIT", "ones")
    code, output = invoke("run", "s.py")
    assert code == ExitCode.USAGE and "PALLAS_CHECK_UNINIT" in output


def test_dma_mode_from_table_reaches_the_engine(project):
    """dma = "eager" in the table hides the read-before-wait's never-written read, as
    --dma eager does; the race stays (races are on by default) until `races = false`."""
    root = Path(__file__).resolve().parents[2]
    sample = root / "samples" / "dma_read_before_wait_bug.py"
    (project / "k.py").write_text(sample.read_text())
    code, output = invoke("run", "k.py", "--format", "text")
    assert code == ExitCode.FINDINGS, output
    assert ": uninitialized: " in output and ": race: " in output, output
    write_pyproject(project, f'dma = "{DmaMode.EAGER.value}"\n')
    code, output = invoke("run", "k.py", "--format", "text")
    assert code == ExitCode.FINDINGS, output
    assert ": uninitialized: " not in output and ": race: " in output, output
    write_pyproject(project, f'dma = "{DmaMode.EAGER.value}"\nraces = false\n')
    code, output = invoke("run", "k.py", "--format", "text")
    assert code == ExitCode.CLEAN, output
    assert "pallas-check: 0 findings in 1 pallas_call; races not checked" in output


@pytest.mark.parametrize("value, on", [("0", False), ("false", False), ("No", False),
                                       (" off ", False), ("", False), ("1", True),
                                       ("true", True), ("YES", True), ("on", True)])
def test_debug_variable_reads_yes_and_no_words(monkeypatch, value, on):
    """PALLAS_CHECK_DEBUG=0 is off (it was on: any non-empty value was): errors are cut
    to one short line, as with the variable unset."""
    from pallas_check.config.environment import debug_requested
    from pallas_check.run.runner import short_error

    monkeypatch.setenv("PALLAS_CHECK_DEBUG", value)
    assert debug_requested() is on
    long_error = "JAX failed: " + "module @x { ... } " * 500
    assert short_error(long_error).endswith("(PALLAS_CHECK_DEBUG=1 shows the rest)") != on


@pytest.mark.parametrize("command", ["run", "diff", "compile"])
def test_a_debug_value_that_is_neither_is_one_line_naming_it(project, monkeypatch,
                                                              command):
    monkeypatch.setenv("PALLAS_CHECK_DEBUG", "maybe")
    code, output = invoke(command, "s.py")
    assert code == ExitCode.USAGE, output
    # (the runner's output holds stderr twice: mixed in, and on its own)
    assert set(output.strip().splitlines()) == {
        "pallas-check: error: environment variable PALLAS_CHECK_DEBUG: expected"
        " 1/true/yes/on or 0/false/no/off, got 'maybe'"}


def test_boolean_option_variables_read_the_same_words(tmp_path):
    (tmp_path / "pyproject.toml").write_text("")
    for value, expected in [("off", False), ("No", False), ("0", False), ("on", True)]:
        settings = load_settings(run, cwd=tmp_path, environ={"PALLAS_CHECK_RACES": value})
        assert settings.values["races"] is expected
    with pytest.raises(SettingsError, match=r"^environment variable PALLAS_CHECK_RACES:"
                                            r" expected .* got 'maybe'$"):
        load_settings(run, cwd=tmp_path, environ={"PALLAS_CHECK_RACES": "maybe"})
