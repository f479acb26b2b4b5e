"""Bug samples the compiled tier runs first: the report under `--tier compiled` is the
report under `--tier engine`, finding for finding (kind, buffer, range, line, message).

(Every sample of `tests/scenarios/test_samples.py`'s COMPILED set runs there with `--tier
compiled` against the finding its docstring states; this compares whole reports.)"""

from __future__ import annotations

import pytest

from scenarios.test_samples import SAMPLES, run_args

CASES = ("oob_load_bug", "dma_read_before_wait_bug", "semaphore_leak_bug",
         "unwritten_half_bug", "stochastic_round_bug")


def _findings(result) -> list[tuple]:
    return sorted((f["kind"], f["buffer"], str(f.get("index_range")), f["message"],
                   str(f.get("frames")), str(f.get("grid_point"))) for f in result.findings)


@pytest.mark.parametrize("name", CASES)
def test_compiled_then_engine_reports_what_the_engine_reports(cli, name):
    path = SAMPLES / f"{name}.py"
    args = run_args(path).split()
    engine = cli("run", *args, "--tier", "engine", str(path))
    compiled = cli("run", *args, "--tier", "compiled", str(path))
    assert engine.exit_code == compiled.exit_code == 1, (engine.output, compiled.output)
    assert _findings(compiled) == _findings(engine) != []
    calls = compiled.report["calls"]
    assert calls and all(c["tier"] == "engine" and c["reason"].startswith(
        "the compiled run saw") for c in calls), calls
