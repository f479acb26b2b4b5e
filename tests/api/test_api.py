"""The Python API (`pallas_check.checking`): the run path of `pallas-check run` around a
block of code, for notebooks and tests (issue 26, item 15)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_check
from pallas_check.api import resolve
from pallas_check.config import DmaMode
from pallas_check.findings.finding import FindingKind
from pallas_check.report.run_report import RunReport

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
X = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)


def _sample(name: str):
    spec = importlib.util.spec_from_file_location(f"api_{name}", SAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BUG = _sample("dma_read_before_wait_bug")
OK = _sample("dma_read_before_wait_ok")


def test_a_buggy_kernel_has_its_findings_with_kind_buffer_range_and_line():
    with pallas_check.checking(dma="on_wait", races=False, project=False) as run:
        jax.block_until_ready(jax.jit(BUG.load_double)(X))
    assert isinstance(run.report, RunReport)
    [finding] = run.findings
    assert finding.kind == FindingKind.UNINITIALIZED
    assert finding.buffer == "buf"
    assert finding.index_range == ((0, 8), (0, 128))
    assert finding.location.file == str(SAMPLES / "dma_read_before_wait_bug.py")
    assert finding.location.line == 25
    assert run.exit_code == 1
    assert [c.kernel for c in run.calls] == ["load_kernel"]


def test_races_are_found_by_default_and_raise_for_findings_lists_them():
    with pallas_check.checking(dma="on_wait", project=False) as run:
        jax.block_until_ready(jax.jit(BUG.load_double)(X))
    kinds = {(f.kind, f.buffer, f.location.line) for f in run.findings}
    assert kinds == {(FindingKind.RACE, "buf", 23), (FindingKind.UNINITIALIZED, "buf", 25)}
    with pytest.raises(pallas_check.FindingsError) as raised:
        run.raise_for_findings()
    message = str(raised.value)
    assert message.startswith("pallas-check: 2 findings in 1 pallas_call:\n")
    assert "dma_read_before_wait_bug.py:23:5: race: load_kernel [buf[0:8, 0:128]]" in message
    assert "dma_read_before_wait_bug.py:25:9: uninitialized: load_kernel" in message
    # A finding's replay is the block's options with its seed, as a checking() call.
    assert "note: replay: pallas_check.checking(seed=0)" in message
    assert raised.value.findings == run.findings
    assert raised.value.report is run.report


def test_a_clean_kernel_has_no_findings_and_its_output_is_right():
    with pallas_check.checking(races=True, project=False) as run:
        out = jax.jit(OK.load_double)(X)
    np.testing.assert_allclose(np.asarray(out), 2.0 * np.asarray(X))
    assert run.findings == [] and run.exit_code == 0
    run.raise_for_findings()  # nothing to raise
    assert run.report.config["races"] is True


def test_the_report_is_the_one_the_cli_renders():
    with pallas_check.checking(project=False) as run:
        jax.block_until_ready(jax.jit(BUG.load_double)(X))
    data = json.loads(run.render("json"))
    assert [f["kind"] for f in data["findings"]] == ["race", "uninitialized"]
    table = run.render("table", width=140)
    assert "load_kernel" in table and "buf[0:8, 0:128]" in table
    assert str(run) == run.render("table")
    html = run._repr_html_()
    assert html.startswith('<pre style="font-family: ') and html.endswith("</pre>")
    assert "load_kernel" in html and "buf[0:8, 0:128]" in html
    assert '<span style="' in html  # the table's colours and bold, as on a terminal
    assert "\x1b" not in html and "\x1b" not in run.render("table")
    assert "\x1b[" in run.render("table", color=True)
    assert repr(run) == "<pallas_check.Run: 2 findings in 1 pallas_call, exit code 1>"


def test_inside_a_jupyter_kernel_the_report_is_written_and_shown_once(monkeypatch):
    """rich's Jupyter mode (any Console made inside an IPython kernel) sends each printed
    line to the notebook as its own display_data; the report's Consoles never use it.
    tests/api/test_notebook.py shows it in a real kernel."""
    import rich.console
    import rich.jupyter

    with pallas_check.checking(dma="on_wait", races=False, project=False) as run:
        jax.block_until_ready(jax.jit(BUG.load_double)(X))
    displayed: list = []
    monkeypatch.setattr(rich.console, "_is_jupyter", lambda: True)
    monkeypatch.setattr(rich.jupyter, "display", lambda *args: displayed.append(args))
    html = run._repr_html_()
    assert "buf[0:8, 0:128]" in html and '<span style="' in html
    assert displayed == []
    bundle = run._repr_mimebundle_()  # what IPython shows: the HTML, the plain table
    assert bundle["text/html"] == html and sorted(bundle) == ["text/html", "text/plain"]
    assert bundle["text/plain"] == run.render("table")
    assert "buf[0:8, 0:128]" in bundle["text/plain"]
    assert bundle["text/plain"].endswith("pallas-check: 1 finding in 1 pallas_call; races not checked\n")
    assert displayed == []


def test_the_report_is_made_when_the_block_ends():
    with pallas_check.checking(project=False) as run:
        assert repr(run) == "<pallas_check.Run: running>"
        with pytest.raises(RuntimeError, match="block ends"):
            run.findings  # noqa: B018


def test_an_exception_in_the_block_goes_on_and_the_report_says_so():
    with pytest.raises(ZeroDivisionError):
        with pallas_check.checking(project=False) as run:
            jax.block_until_ready(jax.jit(OK.load_double)(X))
            1 / 0  # noqa: B018
    assert run.report.user_error == "ZeroDivisionError: division by zero"
    assert run.exit_code == 3 and len(run.calls) == 1


@pytest.mark.parametrize("options, message", [
    ({"dma": "later"}, "dma='later': expected one of eager, on_wait, random, got 'later'"),
    ({"races": "yes"}, "races='yes': expected true or false"),
    ({"schedules": 0}, "schedules=0: must be at least 1"),
    ({"seed": 1.5}, "seed=1.5: expected an integer, got 1.5"),
    ({"tpu": "v9"}, "tpu='v9': --tpu 'v9': expected one or more of v5e, v5p, v6e, v7x"
                    " separated by commas"),
    ({"ignore": ["race"]}, "expected KIND:KERNEL or KIND:PATH-GLOB"),
    ({"tier": "fast"}, "tier='fast': expected one of auto, engine, compiled, got 'fast'"),
])
def test_a_bad_option_value_is_a_one_line_value_error(options, message):
    with pytest.raises(ValueError) as raised:
        with pallas_check.checking(project=False, **options):
            pass
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_an_unknown_option_is_a_type_error_with_a_suggestion():
    with pytest.raises(TypeError, match="unknown option 'race'; did you mean races?"):
        with pallas_check.checking(race=True):
            pass


def test_options_take_config_names_enums_and_paths(tmp_path):
    resolved = resolve({"dma_mode": DmaMode.EAGER, "keep_going": True, "schedules": 3,
                        "uninit": "zero"}, project=False)
    config = resolved.config
    assert config.dma_mode == DmaMode.EAGER and config.keep_going and config.schedules == 3
    assert config.uninit.value == "zero"
    missing = tmp_path / "baseline.json"
    with pytest.raises(ValueError, match="^baseline not found: .*baseline.json"):
        resolve({"baseline": missing}, project=False)


def test_project_settings_apply_below_the_keyword_arguments(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.pallas-check]\nraces = false\nseed = 7\nignore = ["race:load_kernel"]\n')
    monkeypatch.chdir(tmp_path)
    resolved = resolve({"seed": 3, "races": True})
    assert resolved.config.races is True and resolved.config.seed == 3
    assert resolve({}).config.races is False  # the table's `races = false`
    assert [r.text for r in resolved.policy.rules] == ["race:load_kernel"]
    assert resolve({}, project=False).config.races is True  # the default
    (tmp_path / "pyproject.toml").write_text(
        '[tool.pallas-check]\nignore = ["race:load_kernel"]\n')
    with pallas_check.checking() as run:  # the table's `ignore` suppresses the race
        jax.block_until_ready(jax.jit(BUG.load_double)(X))
    assert [f.kind for f in run.findings] == [FindingKind.UNINITIALIZED]
    assert [(f.kind, why.by) for f, why in run.suppressed] == [(FindingKind.RACE, "config")]
    (tmp_path / "pyproject.toml").write_text('[tool.pallas-check]\ndma = "later"\n')
    with pytest.raises(ValueError, match=r"\[tool.pallas-check\] dma: expected one of"):
        pallas_check.checking().__enter__()


def test_checking_blocks_do_not_nest():
    with pallas_check.checking(project=False) as outer:
        with pytest.raises(RuntimeError, match="checking\\(\\) blocks do not nest"):
            with pallas_check.checking(project=False):
                pass
        out = jax.jit(OK.load_double)(X)
    np.testing.assert_allclose(np.asarray(out), 2.0 * np.asarray(X))
    assert outer.findings == [] and len(outer.calls) == 1


def test_calls_the_block_did_not_wait_for_are_in_the_report():
    with pallas_check.checking(project=False) as run:
        jax.jit(BUG.load_double)(X)  # dispatched, never waited for in the block
    assert [(f.kind, f.location.line) for f in run.findings] == [
        (FindingKind.RACE, 23), (FindingKind.UNINITIALIZED, 25)]
