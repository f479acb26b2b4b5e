"""Shared fixtures: run code under interception, run samples through the real CLI."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import jax
import pytest
from typer.testing import CliRunner

from pallas_check.cli.app import app
from pallas_check.config import Config
from pallas_check.findings.finding import Finding
from pallas_check.intercept.session import Session

# The engine and checkers are imported once, here: pytester's in-process runs restore
# sys.modules afterwards, and an engine module first imported inside one would be imported
# again later as a second copy with its own rule registry.
import pallas_check.checkers  # noqa: E402,F401
import pallas_check.engine.call.simulate  # noqa: E402,F401

# The fuzz tests' hypothesis profiles must exist before hypothesis' pytest plugin reads
# --hypothesis-profile (while pytest configures, before tests/fuzz/conftest.py loads).
import fuzz.conftest  # noqa: E402,F401  (tests/ is on sys.path: this folder's conftest)

# pallas-check keeps its compiled programs on disk between processes
# (engine/runtime/disk_cache.py). The tests keep theirs in a folder of this run's own, never
# the developer's: the process that makes it (pytest, or xdist's controller, whose workers
# inherit it) removes it at exit.
if "PALLAS_CHECK_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="pallas-check-test-cache-")
    os.environ["PALLAS_CHECK_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)

# Every run compiles each distinct call for the chip where libtpu is installed
# (intercept/chip.py). The suite's hundreds of runs are about the simulation: they leave it
# off, and the tests of that compile (tests/intercept/test_chip.py, the kernel repository's
# tests/api/test_pytest_plugin.py case) turn it on with `--chip-compile`, which outranks it.
os.environ.setdefault("PALLAS_CHECK_CHIP_COMPILE", "0")

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"


class Checked:
    """Result of running a function under pallas-check: its value and the findings."""

    def __init__(self, value: Any, session: Session) -> None:
        self.value = value
        self.session = session
        self.findings: list[Finding] = session.findings

    def kinds(self) -> list[str]:
        return [f.kind.value for f in self.findings]


@pytest.fixture
def check() -> Callable[..., Checked]:
    """`check(fn, *args, config=Config(...))` runs fn with every pallas_call intercepted."""

    def run(fn: Callable[..., Any], *args: Any, config: Config | None = None,
            **kwargs: Any) -> Checked:
        session = Session(config or Config())
        with session.install():
            value = jax.block_until_ready(fn(*args, **kwargs))
        return Checked(value, session)

    return run


@pytest.fixture
def table_call() -> Callable[..., Callable[..., Any]]:
    """`table_call(kernel, rows, scratch)` is `call(table, x)`: a one-step pallas_call of
    `kernel` with `table` scalar-prefetched, `x` left in HBM for the kernel's own DMAs, an
    (rows, 128) f32 output block and `scratch` (the shape of page-table gather kernels)."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def make(kernel: Callable[..., Any], rows: int, scratch: list) -> Callable[..., Any]:
        def call(table: Any, x: Any) -> Any:
            return pl.pallas_call(
                kernel,
                grid_spec=pltpu.PrefetchScalarGridSpec(
                    num_scalar_prefetch=1, grid=(1,),
                    in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                    out_specs=pl.BlockSpec((rows, 128), lambda i, t: (0, 0)),
                    scratch_shapes=scratch),
                out_shape=jax.ShapeDtypeStruct((rows, 128), x.dtype))(table, x)
        return call

    return make


class CliResult:
    def __init__(self, exit_code: int, report: dict | None, output: str, stderr: str) -> None:
        self.exit_code = exit_code
        self.report = report
        self.output = output
        self.stderr = stderr

    @property
    def findings(self) -> list[dict]:
        return self.report["findings"] if self.report else []


@pytest.fixture
def cli(tmp_path: Path) -> Callable[..., CliResult]:
    """`cli("run", "samples/x.py", "--dma", "eager")` through typer's CliRunner, JSON report."""

    def invoke(*args: str, json_report: bool = True) -> CliResult:
        argv = list(args)
        out_file = tmp_path / f"report-{len(list(tmp_path.iterdir()))}.json"
        if json_report and argv and argv[0] == "run":
            argv[1:1] = ["--format", "json", "--output", str(out_file)]
        runner = CliRunner()
        result = runner.invoke(app, argv, catch_exceptions=False)
        report = json.loads(out_file.read_text()) if out_file.exists() else None
        stderr = result.stderr if hasattr(result, "stderr") else ""
        return CliResult(result.exit_code, report, result.output, stderr)

    return invoke


@pytest.fixture
def sample() -> Callable[[str], str]:
    """Absolute path of a file in samples/."""

    def path(name: str) -> str:
        full = SAMPLES / name
        assert full.exists(), full
        return str(full)

    return path


os.environ.setdefault("JAX_PLATFORMS", "cpu")
