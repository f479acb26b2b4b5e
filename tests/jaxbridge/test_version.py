"""The bridge's supported JAX range: checked once at import, one line naming the range
(exit 2 through the command line's error path), and the same range as pyproject's pin."""

from __future__ import annotations

import pathlib
import re

import jax
import pytest

from pallas_check.config.exitcodes import ExitCode
from pallas_check.jaxbridge import version


def test_installed_jax_is_in_range() -> None:
    version.check(jax.__version__)  # the bridge imported, so it passed; and it says so


@pytest.mark.parametrize("given", ["0.9.1", "0.10.3", "0.11.0", "1.0.0", "nightly"])
def test_an_unknown_version_is_one_line_naming_the_range(given: str) -> None:
    with pytest.raises(version.UnsupportedJax) as caught:
        version.check(given)
    message = str(caught.value)
    assert "\n" not in message
    assert f"jax {given} is not supported" in message
    assert ">=0.9.2,<=0.10.2" in message
    assert caught.value.exit_code == ExitCode.USAGE


@pytest.mark.parametrize("given", ["0.9.2", "0.10.0", "0.10.2", "0.10.2.dev20260101"])
def test_versions_inside_the_range_pass(given: str) -> None:
    version.check(given)


def test_the_command_line_prints_it_as_one_line() -> None:
    from pallas_check.cli.app import _one_line

    message, code = _one_line(version.UnsupportedJax("jax 0.11.0 is not supported: x"))
    assert message == "pallas-check: error: jax 0.11.0 is not supported: x"
    assert code == ExitCode.USAGE


def test_pyproject_pins_the_same_range() -> None:
    text = (pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    pin = re.search(r'"jax>=([\d.]+),<([\d.]+)"', text)
    assert pin is not None
    oldest = tuple(int(x) for x in pin[1].split("."))
    assert oldest == version.OLDEST
    # "<0.10.3" pins up to 0.10.2 inclusive
    below = tuple(int(x) for x in pin[2].split("."))
    assert below == (version.NEWEST[0], version.NEWEST[1], version.NEWEST[2] + 1)
