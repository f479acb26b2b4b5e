"""Builds of the compiled tier under a budget (intercept/builds.py): a build that overruns
is abandoned, the engine's results and findings stand, the abandonment is remembered on
disk by later processes (and not by a fresh cache), and `--tier compiled` says why it
refuses such a structure. Overruns are made deterministic with a time budget of 0
(`PALLAS_CHECK_COMPILE_BUDGET`): the worker process is started, handed the program and
killed at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_check.config import Config, Tier
from pallas_check.config.environment import CACHE_VARIABLE, COMPILE_BUDGET_VARIABLE
from pallas_check.engine.runtime import disk_cache
from pallas_check.intercept import builds, tiers
from pallas_check.intercept.session import Session

from compiled.test_tier import checked, dma_call, findings

TESTS = Path(__file__).parent.parent


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv(CACHE_VARIABLE, str(folder))
    return folder


def _built_at_first_call(monkeypatch) -> None:
    monkeypatch.setattr(tiers, "compile_seconds", lambda call: 0.0)
    monkeypatch.setattr(tiers.Tiers, "wait_for_builds", True)


def _records(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.abandoned"))


def test_a_build_over_its_budget_is_abandoned_and_the_engine_reports_the_call(
        cache_dir, monkeypatch):
    x = jax.random.normal(jax.random.key(0), (16, 8, 128), jnp.float32)
    call = jax.jit(dma_call(16, 16))  # its last DMA leaves x: an out-of-bounds finding
    want, engine = checked(call, x, tier=Tier.ENGINE)
    _built_at_first_call(monkeypatch)
    monkeypatch.setenv(COMPILE_BUDGET_VARIABLE, "0")
    session = Session(Config(tier=Tier.AUTO))
    with session.install():
        got = [np.asarray(jax.block_until_ready(call(x))) for _ in range(2)]
    reasons = [(c.tier, c.tier_reason) for c in session.calls]
    print(reasons)
    assert reasons == [("engine", f"{builds.ABANDONED}: its XLA compile passed its time "
                                  "budget (0.0 s)")] * 2
    assert findings(session) == findings(engine) != []
    for out in got:
        np.testing.assert_array_equal(out, want)
    [record] = _records(cache_dir)
    print(record.read_text())
    assert json.loads(record.read_text())["reason"].startswith("its XLA compile passed")


def test_tier_compiled_refuses_an_abandoned_structure_with_the_reason(cache_dir, monkeypatch):
    x = jax.random.normal(jax.random.key(1), (16, 8, 128), jnp.float32)
    call = jax.jit(dma_call(16, 3))
    _built_at_first_call(monkeypatch)
    monkeypatch.setenv(COMPILE_BUDGET_VARIABLE, "0")
    checked(call, x, tier=Tier.AUTO)
    monkeypatch.delenv(COMPILE_BUDGET_VARIABLE)
    session = Session(Config(tier=Tier.COMPILED))
    with pytest.raises(Exception):
        with session.install():
            jax.block_until_ready(call(x))
    print(session.engine_error)
    assert session.error_code == 2
    assert session.engine_error is not None and "\n" not in session.engine_error
    assert session.engine_error.endswith(
        f"cannot run compiled: {builds.ABANDONED}: its XLA compile passed its time budget "
        "(0.0 s)")


_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
import jax, jax.numpy as jnp
from pallas_check.config import Config, Tier
from pallas_check.intercept import tiers
from pallas_check.intercept.session import Session
from compiled.test_tier import dma_call
tiers.compile_seconds = lambda call: 0.0
tiers.Tiers.wait_for_builds = True
call = jax.jit(dma_call(16, 3))
x = jax.random.normal(jax.random.key(2), (16, 8, 128), jnp.float32)
session = Session(Config(tier=Tier.AUTO))
with session.install():
    for _ in range(2):
        jax.block_until_ready(call(x))
for c in session.calls:
    print("CALL", c.tier, c.tier_reason)
"""


def _run(tmp_path: Path, cache: Path, budget: str | None) -> list[str]:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(_SCRIPT.format(tests=str(TESTS))))
    env = {k: v for k, v in os.environ.items() if k != COMPILE_BUDGET_VARIABLE}
    env[CACHE_VARIABLE] = str(cache)
    if budget is not None:
        env[COMPILE_BUDGET_VARIABLE] = budget
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    calls = [line for line in done.stdout.splitlines() if line.startswith("CALL")]
    print(calls)
    return calls


def test_an_abandoned_build_is_remembered_by_a_new_process_and_a_fresh_cache_retries(
        tmp_path):
    cache = tmp_path / "cache"
    abandoned = f"CALL engine {builds.ABANDONED}: its XLA compile passed its time budget (0.0 s)"
    assert _run(tmp_path, cache, "0") == [abandoned] * 2
    assert len(_records(cache)) == 1
    # A new process, with its usual budget: the record is read, no build is tried.
    assert _run(tmp_path, cache, None) == [abandoned] * 2
    # A fresh cache holds no record: the structure is built and its calls run compiled.
    assert _run(tmp_path, tmp_path / "fresh", None) == ["CALL compiled "] * 2


def test_a_torn_or_foreign_record_is_not_trusted(cache_dir):
    cache_dir.mkdir()
    torn = cache_dir / "a.abandoned"
    torn.write_text("{not json")
    assert disk_cache.abandoned("a") is None and not torn.exists()
    disk_cache.abandon("b", "over")
    assert disk_cache.abandoned("b") == "over"
    record = json.loads((cache_dir / "b.abandoned").read_text())
    (cache_dir / "b.abandoned").write_text(json.dumps({**record, "jax": "0.0.1"}))
    assert disk_cache.abandoned("b") is None  # another JAX's: stale


def test_the_record_key_follows_the_structure_and_the_tier_settings():
    text = "jaxpr={ lambda ; a. let } fn=<function f at 0x7f00aa>"
    moved = text.replace("0x7f00aa", "0x7f11bb")
    assert builds.record_key(text, Config()) == builds.record_key(moved, Config())
    assert builds.record_key(text, Config()) != builds.record_key(text, Config(races=False))
