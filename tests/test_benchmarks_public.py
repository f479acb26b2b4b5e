"""benchmarks/ uses only pallas-check's public API (issue 27), so that moving the package's
insides cannot silently switch a benchmark table off again (the race-cost table once
vanished when `RaceChecker`, which run.py patched, moved). What the tables need is in the
API: each call's CallSummary says what race checking covered (`races`) and, with
compile=True, each generation's compile time; `pallas_check.simulated_tpu` tells JAX's own
interpreters which TPU a kernel asks about."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import pallas_check

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
# The public API: the package's top-level names (`__all__`, `__version__`) and api.py.
PUBLIC_MODULES = {"pallas_check", "pallas_check.api"}
PUBLIC_NAMES = {*pallas_check.__all__, "__version__", "api"}


def _private(dotted: str) -> bool:
    """`pallas_check.X...` where X is not public (`pallas_check.api.checking` is)."""
    parts = dotted.split(".")
    return parts[0] == "pallas_check" and len(parts) > 1 and parts[1] not in PUBLIC_NAMES


def _private_uses(path: Path, root: Path = ROOT) -> list[str]:
    """Every place `path` reaches into pallas_check beyond the public API: imports of a
    submodule or of a name the package does not export, attribute chains such as
    `pallas_check.checkers.X`, and module paths in strings (`importlib.import_module`,
    `monkeypatch.setattr("pallas_check.x.Y", ...)`)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[str] = []
    for node in sorted(ast.walk(tree), key=lambda n: getattr(n, "lineno", 0)):
        where = f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            found += [f"{where} imports {a.name}" for a in node.names if _private(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if _private(node.module):
                found.append(f"{where} imports from {node.module}")
            elif node.module == "pallas_check":
                found += [f"{where} imports pallas_check.{a.name}" for a in node.names
                          if _private(f"pallas_check.{a.name}")]
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id == "pallas_check" and _private(f"pallas_check.{node.attr}")):
            found.append(f"{where} uses pallas_check.{node.attr}")
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and re.fullmatch(r"pallas_check(\.\w+)+", node.value) and _private(node.value)):
            found.append(f"{where} names {node.value!r}")
    return found


def test_the_benchmarks_use_only_the_public_api():
    scripts = sorted(BENCHMARKS.glob("*.py"))
    assert BENCHMARKS / "run.py" in scripts and BENCHMARKS / "_compile_calls.py" in scripts
    assert [use for path in scripts for use in _private_uses(path)] == []


def test_the_check_sees_each_way_of_reaching_inside(tmp_path):
    """The check itself: each of these would let a refactor switch a table off."""
    script = tmp_path / "bench.py"
    script.write_text("import pallas_check\n"
                      "import pallas_check.checkers as checkers\n"
                      "from pallas_check.intercept.tpu_info import simulated_tpu\n"
                      "from pallas_check import checking; from pallas_check.intercept import session\n"
                      "from pallas_check.api import checking as ok\n"
                      "x = pallas_check.engine.kernel\n"
                      "importlib.import_module('pallas_check.intercept.session')\n"
                      "pallas_check.checking, pallas_check.simulated_tpu, pallas_check.api\n"
                      "'pallas_check.checking(races=True) in a docstring'\n")
    uses = _private_uses(script, tmp_path)
    assert uses == ["bench.py:2 imports pallas_check.checkers",
                    "bench.py:3 imports from pallas_check.intercept.tpu_info",
                    "bench.py:4 imports from pallas_check.intercept",
                    "bench.py:6 uses pallas_check.engine",
                    "bench.py:7 names 'pallas_check.intercept.session'"]


def _add_call(grid: int):
    def add_kernel(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] + y_ref[...]

    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    call = pl.pallas_call(add_kernel, grid=(grid,), in_specs=[spec, spec], out_specs=spec,
                          out_shape=jax.ShapeDtypeStruct((8 * grid, 128), jnp.float32))
    x = jnp.arange(8 * grid * 128, dtype=jnp.float32).reshape(8 * grid, 128)
    return jax.jit(call), x


def _race_cost(grid: int, races: bool = True) -> tuple[dict, dict]:
    fn, x = _add_call(grid)
    with pallas_check.checking(races=races, project=False) as run:
        out = fn(x, x)
    np.testing.assert_array_equal(np.asarray(out), 2.0 * np.asarray(x))
    [call] = run.calls
    return call.races, json.loads(run.render("json"))["calls"][0]["races"]


def test_each_call_says_what_race_checking_covered():
    """The race-cost table's numbers, from the public API: a constant number of checked
    accesses per grid step (at least the kernel's own two reads and one write), and a
    history per buffer that stops growing however long the grid runs (pruning)."""
    short, short_json = _race_cost(128)
    long, long_json = _race_cost(256)
    assert set(short) == {"accesses_checked", "longest_history"}
    assert short["accesses_checked"] >= 3 * 128
    assert long["accesses_checked"] == 2 * short["accesses_checked"]
    assert 0 < long["longest_history"] == short["longest_history"] < 128
    assert (short_json, long_json) == (short, long)  # the JSON report carries it too


def test_with_races_off_no_race_cost():
    races, in_json = _race_cost(8, races=False)
    assert races == {} and in_json is None


def test_simulated_tpu_tells_kernels_which_tpu_they_run_on():
    """What JAX's own interpreters need for a kernel that asks (emit_pipeline): the
    benchmarks run them under it."""
    assert not pltpu.is_tpu_device()
    with pallas_check.simulated_tpu("v6e"):
        assert pltpu.is_tpu_device() and pltpu.get_tpu_info().generation == 6
    assert not pltpu.is_tpu_device()
    with pytest.raises(ValueError):
        with pallas_check.simulated_tpu("v9z"):
            pass


def _run_script(monkeypatch):
    """benchmarks/run.py as a module (its XLA_FLAGS line sees the flag already set)."""
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
    monkeypatch.setattr(sys, "path", list(sys.path))  # it adds samples/ to the path
    spec = importlib.util.spec_from_file_location("benchmarks_run", BENCHMARKS / "run.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "benchmarks_run", module)  # its dataclasses look it up
    spec.loader.exec_module(module)
    return module


class _Run:
    """A Run whose report says nothing of race checking (as before CallSummary.races)."""

    def __init__(self, calls):
        self.calls = calls


def test_run_py_stops_when_the_race_cost_is_missing(monkeypatch):
    """A table's data missing is an error that stops the run, not a table left out."""
    bench = _run_script(monkeypatch)
    call = SimpleNamespace(seconds=0.1, races={})
    with pytest.raises(bench.BenchmarkBroken, match="race-cost table"):
        bench._timed_calls(_Run([call, call]), bench.PC_ON)
    assert bench._timed_calls(_Run([call, call]), bench.PC_OFF) == {"engine_seconds": 0.1}
    b = bench.Bench("add-8", "add", 8, "", lambda interpret: None)
    timed = {"time": {"add-8": {bench.PC_ON: {"seconds": 1.0}, bench.PC_OFF: {"seconds": 0.5}}}}
    with pytest.raises(bench.BenchmarkBroken, match="no accesses checked"):
        bench.race_cost(timed, [b])
    timed["time"]["add-8"][bench.PC_ON].update(accesses_checked=100, max_history=7)
    assert bench.race_cost(timed, [b]) == {"add-8": {
        "accesses": 100, "max_history": 7, "us_per_access": 1e4, "extra_us_per_access": 5e3}}
