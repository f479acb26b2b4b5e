"""Every option declared in options.py reaches every surface: the `run` command, the
[tool.pallas-check] table, PALLAS_CHECK_* variables, the Config, the replay command and
(where declared) the pytest plugin. Adding an option is one entry in options.py."""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path

import pytest
import typer

from pallas_check import pytest_plugin
from pallas_check.cli.app import app, run
from pallas_check.config import Config
from pallas_check.config.exitcodes import ExitCode
from pallas_check.config.layers import load_settings
from pallas_check.config.options import RUN_OPTIONS, Option
from pallas_check.report.run_report import replay_command

IDS = [o.key for o in RUN_OPTIONS]


def sample(option: Option) -> tuple[object, str]:
    """A non-default value of the option: as TOML text and as the converted value."""
    if option.kind is bool:  # the value that is not the default (races: off)
        return (False, "false") if option.default else (True, "true")
    if isinstance(option.kind, type) and issubclass(option.kind, enum.Enum):
        member = [m for m in option.kind if m != option.default][-1]
        return member.value, f'"{member.value}"'
    if option.kind is int:
        value = (option.minimum or 0) + 2
        return value, str(value)
    if _is_list(option):
        return ["race:k"], '["race:k"]'
    if option.param == "tpu":  # a list of TPU generations
        return "v6e,v7x", '"v6e,v7x"'
    return "r.json", '"r.json"'  # a path


def _is_list(option: Option) -> bool:
    return "List" in str(option.kind) or "list" in str(option.kind)


def _is_path(option: Option) -> bool:
    return "Path" in str(option.kind)


@pytest.mark.parametrize("option", RUN_OPTIONS, ids=IDS)
def test_the_run_command_takes_it(option):
    command = typer.main.get_command(app).commands["run"]
    flags = {flag for param in command.params for flag in param.opts}
    assert set(option.flags) <= flags
    off = {flag for param in command.params for flag in param.secondary_opts}
    assert (option.negative in off) if option.negative else not off & set(option.flags)
    # A flag on by default can be turned off: otherwise `--races` could never be undone.
    assert option.kind is not bool or not option.default or option.negative


@pytest.mark.parametrize("option", RUN_OPTIONS, ids=IDS)
def test_the_table_and_the_environment_set_it(option, tmp_path):
    value, toml = sample(option)
    (tmp_path / "pyproject.toml").write_text(f"[tool.pallas-check]\n{option.key} = {toml}\n")
    settings = load_settings(run, cwd=tmp_path, environ={})
    # A path in pyproject.toml is relative to its folder.
    expected = str(tmp_path / value) if _is_path(option) else value
    assert settings.values == {option.param: expected}
    env_text = ",".join(value) if _is_list(option) else toml.strip('"')
    (tmp_path / "pyproject.toml").unlink()
    settings = load_settings(run, cwd=tmp_path, environ={option.env: env_text})
    assert settings.values == {option.param: value}


@pytest.mark.parametrize("option", RUN_OPTIONS, ids=IDS)
def test_the_config_and_the_replay_command_follow_it(option):
    if option.config_field is None:
        assert not option.replayed
        return
    assert option.config_field in {f.name for f in dataclasses.fields(Config)}
    value, _ = sample(option)
    config = {option.config_field: value}
    replay = replay_command("k.py", config, seed=3)
    shown = (option.switch(value) if option.kind is bool
             else " ".join(f"{option.flags[0]} {v}" for v in value) if _is_list(option)
             else f"{option.flags[0]} {value}")
    assert (shown in replay) == option.replayed, replay


@pytest.mark.parametrize("option", RUN_OPTIONS, ids=IDS)
def test_the_pytest_plugin_offers_what_is_declared_for_it(option):
    registered: list[str] = []

    class Group:
        def addoption(self, name, **kwargs):
            registered.append(name)

    class Parser:
        def getgroup(self, *args):
            return Group()

    pytest_plugin.pytest_addoption(Parser())
    assert (f"--pallas-check-{option.key}" in registered) == option.pytest
    if option.negative is not None:
        assert (option.switch(False, "--pallas-check-") in registered) == option.pytest
    if option.pytest and option.replayed:
        value, _ = sample(option)
        replay = replay_command("k.py", {option.config_field: value}, seed=0,
                                rerun="pytest t.py::test --pallas-check")
        flag = (option.switch(value, "--pallas-check-") if option.kind is bool
                else f"--pallas-check-{option.key}")
        assert f" {flag}" in replay, replay


def test_every_config_field_a_user_sets_has_an_option():
    declared = {o.config_field for o in RUN_OPTIONS}
    # not a user's choice; timeline is on when --trace names a file
    internal = {"check_uninit_outputs", "timeline"}
    assert {f.name for f in dataclasses.fields(Config)} - internal <= declared


def test_output_is_a_path():
    assert [o.kind for o in RUN_OPTIONS if o.param == "output"][0].__args__[0] is Path


@pytest.mark.parametrize("option", RUN_OPTIONS, ids=IDS)
def test_the_config_default_is_the_options_default(option):
    """A default is written in the table (the CLI's) and on the Config field (the engine's
    and the API's): they agree, so `run` with no flag and `checking()` check alike."""
    if option.config_field is None:
        return
    defaults = {f.name: f.default for f in dataclasses.fields(Config)}
    if option.config_field in BUILT_OFF:
        assert (defaults[option.config_field], option.default) == (False, True)
        return
    assert defaults[option.config_field] == option.default


@pytest.mark.parametrize("option", RUN_OPTIONS, ids=IDS)
def test_config_from_sets_the_field_of_each_option(option):
    """The one way a Config is built (config_from: run, diff, the API, the pytest plugin)
    sets an option's field from its value, a choice's text as its enum member."""
    from pallas_check.config.options import config_from

    if option.config_field is None:
        assert config_from({option.param: sample(option)[0]}) == Config()
        return
    value, _ = sample(option)
    built = getattr(config_from({option.param: value}), option.config_field)
    assert built == value
    if isinstance(option.kind, type) and issubclass(option.kind, enum.Enum):
        assert built is option.kind(value)


# On in every run (the option's default: `run`, the plugin and the API read the table) but
# off in a Config built directly, as the engine's own tests build theirs: the chip's
# compile at each call (intercept/chip.py) and the MXU's rounding (jaxbridge/chip_arithmetic.py)
# are the run's, not the engine's.
BUILT_OFF = {"chip_compile": True, "chip_arithmetic": True}


def test_config_from_of_every_default_is_the_default_config():
    from pallas_check.config.options import config_from

    assert config_from({o.param: o.default for o in RUN_OPTIONS}) == Config(**BUILT_OFF)
    assert config_from({}, timeline=True) == Config(timeline=True)


CHOICES = [o for o in RUN_OPTIONS if o.choices]


@pytest.mark.parametrize("option", CHOICES, ids=[o.key for o in CHOICES])
def test_a_choice_that_is_none_is_one_line_and_exit_2(option, tmp_path, monkeypatch):
    """`--tier bogus` (and every choice's like): the one line naming the choices, exit 2,
    before the script runs."""
    from typer.testing import CliRunner

    monkeypatch.chdir(tmp_path)
    (tmp_path / "k.py").write_text("open('ran.txt', 'w').close()\n")
    result = CliRunner().invoke(app, ["run", "k.py", option.flags[0], "bogus"])
    assert result.exit_code == ExitCode.USAGE
    choices = ", ".join(f"'{c}'" for c in option.choices)
    assert result.output.strip() == (
        f"pallas-check: error: Invalid value for '{option.flags[0]}': Value error, 'bogus'"
        f" is not one of {choices}.")
    assert not (tmp_path / "ran.txt").exists()
