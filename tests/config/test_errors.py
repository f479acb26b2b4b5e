"""errors.py: every error a user meets is a PallasCheckError carrying its exit code, and the
command line maps an error to its code through that base class, in one place."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from pallas_check.config import errors
from pallas_check.cli.app import app
from pallas_check.config.exitcodes import ExitCode

USAGE = [errors.UsageError, errors.SettingsError, errors.SuppressionError,
         errors.OutputError, errors.SchemaError, errors.TierRefused]


@pytest.mark.parametrize("error", USAGE, ids=lambda e: e.__name__)
def test_a_bad_value_or_file_is_a_usage_error(error):
    assert issubclass(error, errors.PallasCheckError)
    assert error("x").exit_code == ExitCode.USAGE


@pytest.mark.parametrize("error", [errors.InternalError, errors.EngineFailure],
                         ids=lambda e: e.__name__)
def test_our_own_failure_is_internal(error):
    assert error("x").exit_code == ExitCode.INTERNAL


def test_the_names_stay_importable_where_they_were_raised():
    from pallas_check.api import FindingsError
    from pallas_check.commands.sides import UsageError
    from pallas_check.config.layers import SettingsError
    from pallas_check.deliver.outfile import OutputError
    from pallas_check.report.schema import SchemaError
    from pallas_check.intercept.session import EngineFailure
    from pallas_check.report.suppress import SuppressionError

    assert (FindingsError, UsageError, SettingsError, OutputError, SchemaError,
            EngineFailure, SuppressionError) == (
        errors.FindingsError, errors.UsageError, errors.SettingsError, errors.OutputError,
        errors.SchemaError, errors.EngineFailure, errors.SuppressionError)


def test_findings_error_carries_the_runs_exit_code():
    class Report:
        exit_code = 4

    error = errors.FindingsError("pallas-check could not check the block", [], Report())
    assert error.exit_code == ExitCode.INTERNAL


def test_the_cli_exits_with_the_code_the_error_carries(tmp_path, monkeypatch):
    """No per-class handling: an error of ours raised before the run, of a class the
    command line has never heard of, is its one line and its own exit code."""
    import pallas_check.config.layers as layers

    class Odd(errors.PallasCheckError):
        exit_code = ExitCode.USER_ERROR

    def broken(*args, **kwargs):
        raise Odd("an odd error of ours")

    monkeypatch.setattr(layers, "load_settings", broken)
    (tmp_path / "s.py").write_text("print('ran')\n")
    result = CliRunner().invoke(app, ["run", str(tmp_path / "s.py")],
                                catch_exceptions=False)
    assert result.exit_code == ExitCode.USER_ERROR
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines == ["pallas-check: error: an odd error of ours"]
