"""`--help` says what to type (issue 26, item 7): `SCRIPT`, `KIND:TARGET`, `N`, `PATH`,
choices as `[a|b]`; never typer's Python types (`{script}`, `<list[str]>`, `<int range>`),
and a command offers only the formats it takes."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from pallas_check.cli.app import app
from pallas_check.config.exitcodes import ExitCode
from pallas_check.config.options import (COMPILE_OPTIONS, DIFF_OPTIONS, RECORD_OPTIONS,
                                         RUN_OPTIONS)

COMMANDS = {"run": RUN_OPTIONS, "compile": COMPILE_OPTIONS, "diff": DIFF_OPTIONS,
            "record": RECORD_OPTIONS}


def _help(*command: str) -> str:
    result = CliRunner().invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("command", ["run", "compile", "diff", "record", "hook"])
def test_no_python_type_in_the_help(command):
    text = _help(command)
    # typer's words: <path>, <str>, <int range>, <list[str]>, <eager|on_wait>, {script}
    assert not re.search(r"<[a-z][a-z_\[\]| ]*>|\{[a-z_]+\}|list\[", text), text


@pytest.mark.parametrize("command, usage", [
    ("run", "[OPTIONS] SCRIPT [ARGS]..."),
    ("compile", "[OPTIONS] SCRIPT [ARGS]..."),
    ("diff", "[OPTIONS] SCRIPT [ARGS]..."),
    ("record", "[OPTIONS] SCRIPT [ARGS]..."),
    ("hook", "[OPTIONS] [FILES]..."),
])
def test_the_usage_line_names_the_arguments(command, usage):
    first = _help(command).splitlines()[0]
    assert first.startswith("Usage: ") and first.endswith(f" {command} {usage}"), first


def test_run_help_says_what_to_type():
    text = _help("run")
    lines = {line.strip().split("  ")[0] for line in text.splitlines()}
    for expected in ("SCRIPT", "ARGS...", "--dma [eager|on_wait|random]",
                     "--uninit [nan|zero]", "--format [table|json|sarif|text]",
                     "-o, --output PATH", "--tpu LIST", "--devices N", "--cores N",
                     "--seed N", "--schedules N", "--trace PATH", "--ignore KIND:TARGET",
                     "--baseline PATH", "--races / --no-races", "--update-baseline"):
        assert expected in lines, (expected, text)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_with_a_value_shows_a_placeholder(command):
    text = " ".join(_help(command).split())
    for option in COMMANDS[command]:
        if option.kind is bool:
            assert option.shown_metavar is None
            continue
        metavar = option.shown_metavar
        assert metavar and (re.fullmatch(r"[A-Z][A-Z:]*", metavar)
                            or re.fullmatch(r"\[[a-z0-9_|]+\]", metavar)), option.param
        assert f"{option.flags[-1] if len(option.flags) > 1 else option.flags[0]}" in text
        assert f"{option.flags[0]} {metavar}" in text, (option.flags, metavar)


@pytest.mark.parametrize("command", ["compile", "diff"])
def test_compile_and_diff_offer_only_the_formats_they_take(command, tmp_path, monkeypatch):
    """Both report tables of calls; `sarif` and `text` were offered, then refused."""
    text = _help(command)
    assert "--format [table|json]" in text and "sarif" not in text
    monkeypatch.chdir(tmp_path)
    (tmp_path / "k.py").write_text("open('ran.txt', 'w').close()\n")
    for fmt in ("sarif", "text"):
        result = CliRunner().invoke(app, [command, "k.py", "--format", fmt])
        assert result.exit_code == ExitCode.USAGE
        assert result.output.strip() == (
            f"pallas-check: error: Invalid value for '--format': Value error, '{fmt}' is not"
            " one of 'table', 'json'.")
    assert not (tmp_path / "ran.txt").exists()


def test_a_missing_script_is_named_as_the_help_names_it():
    result = CliRunner().invoke(app, ["run"])
    assert result.exit_code == ExitCode.USAGE
    assert result.output.strip() == "pallas-check: error: Missing argument 'SCRIPT'."
