"""The disk cache of our own executables (engine/runtime/disk_cache.py): a program compiled
in one process is read back in the next, by the compiled tier too, and an entry that cannot
be read, a folder that cannot be written and `off` all end in a plain compile."""

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

from pallas_check.config import Tier
from pallas_check.engine.runtime import disk_cache
from pallas_check.engine.runtime.backend import engine_device

from compiled.test_tier import checked, reduce_call


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    where = tmp_path / "xla"
    monkeypatch.setenv(disk_cache.ENV, str(where))
    monkeypatch.setattr(disk_cache, "counts", disk_cache.CacheCounts())
    return where


def _lowered(scale: float = 3.0):
    def program(x):
        return x * scale + 1.0

    with jax.default_device(engine_device()):
        return jax.jit(program).lower(jax.ShapeDtypeStruct((8, 128), jnp.float32))


def _want(x: np.ndarray, scale: float = 3.0) -> np.ndarray:
    return x * scale + 1.0


X = np.linspace(-2, 2, 8 * 128, dtype=np.float32).reshape(8, 128)

_PROCESS = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    from pallas_check.engine.runtime import disk_cache
    from pallas_check.engine.runtime.backend import engine_device
    with jax.default_device(engine_device()):
        lowered = jax.jit(lambda x: x * 3.0 + 1.0).lower(
            jax.ShapeDtypeStruct((8, 128), jnp.float32))
    compiled = disk_cache.compile_cached(lowered, engine_device(), {"opt": 1})
    x = np.linspace(-2, 2, 8 * 128, dtype=np.float32).reshape(8, 128)
    out = np.asarray(compiled(x))
    print(json.dumps({"hits": disk_cache.counts.hits, "written": disk_cache.counts.written,
                      "out": out.ravel()[:4].tolist()}))
""")


def test_a_program_compiled_in_one_process_is_read_back_in_the_next(cache_dir):
    """The point of the cache: the key (the program's text and the rest) is the same in a
    fresh process, and what is read back computes what the compile did."""
    env = {**os.environ, disk_cache.ENV: str(cache_dir)}
    runs = [json.loads(subprocess.run([sys.executable, "-c", _PROCESS], env=env, check=True,
                                      capture_output=True, text=True).stdout.splitlines()[-1])
            for _ in range(2)]
    assert [(r["hits"], r["written"]) for r in runs] == [(0, 1), (1, 0)]
    assert len(list(cache_dir.glob("*.xla"))) == 1
    np.testing.assert_allclose(runs[1]["out"], _want(X).ravel()[:4], rtol=1e-6, atol=1e-6)
    assert runs[0]["out"] == runs[1]["out"]


def test_an_unreadable_entry_is_compiled_again_and_replaced(cache_dir):
    lowered = _lowered()
    disk_cache.compile_cached(lowered, engine_device())
    [entry] = cache_dir.glob("*.xla")
    entry.write_bytes(b"torn")
    compiled = disk_cache.compile_cached(lowered, engine_device())
    np.testing.assert_allclose(np.asarray(compiled(X)), _want(X), rtol=1e-6, atol=1e-6)
    assert (disk_cache.counts.unreadable, disk_cache.counts.written) == (1, 2)
    disk_cache.compile_cached(lowered, engine_device())
    assert disk_cache.counts.hits == 1  # the replacement reads back


def test_the_key_is_the_program_and_its_options(cache_dir):
    lowered = _lowered()
    key = disk_cache.key(lowered.as_text(), {"a": 1})
    assert key == disk_cache.key(_lowered().as_text(), {"a": 1})
    assert key != disk_cache.key(lowered.as_text(), {"a": 2})
    assert key != disk_cache.key(_lowered(scale=4.0).as_text(), {"a": 1})
    two = [disk_cache.compile_cached(_lowered(s), engine_device()) for s in (3.0, 4.0)]
    np.testing.assert_allclose(np.asarray(two[1](X)), _want(X, 4.0), rtol=1e-6, atol=1e-6)
    assert len(list(cache_dir.glob("*.xla"))) == 2


def test_off_keeps_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(disk_cache.ENV, "off")
    monkeypatch.setattr(disk_cache, "counts", disk_cache.CacheCounts())
    assert disk_cache.folder() is None
    compiled = disk_cache.compile_cached(_lowered(), engine_device())
    np.testing.assert_allclose(np.asarray(compiled(X)), _want(X), rtol=1e-6, atol=1e-6)
    assert disk_cache.counts == disk_cache.CacheCounts()


def test_a_folder_that_cannot_be_written_is_no_error(tmp_path, monkeypatch):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv(disk_cache.ENV, str(blocked / "xla"))
    compiled = disk_cache.compile_cached(_lowered(), engine_device())
    np.testing.assert_allclose(np.asarray(compiled(X)), _want(X), rtol=1e-6, atol=1e-6)
    assert blocked.read_text() == "not a folder"


def test_past_the_limit_the_least_recently_used_go(tmp_path, monkeypatch):
    for age, name in enumerate(["newest", "middle", "oldest"]):
        entry = tmp_path / f"{name}.xla"
        entry.write_bytes(b"x" * 100)
        os.utime(entry, (1_000_000 - age, 1_000_000 - age))
    (tmp_path / "other.txt").write_bytes(b"y" * 1000)  # not an entry: left alone
    monkeypatch.setattr(disk_cache, "_LIMIT_BYTES", 250)
    disk_cache._prune(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["middle.xla", "newest.xla",
                                                          "other.txt"]


def test_the_compiled_tier_reads_a_structure_back_in_a_new_session(cache_dir):
    """A second session (a test suite's next process) builds the structure again and
    finds its executable on disk: same outputs, no second compile."""
    x = jax.random.normal(jax.random.key(1), (32, 512), jnp.float32)
    y = jax.random.normal(jax.random.key(2), (32, 512), jnp.float32)
    call = reduce_call(32, 4)
    first, session = checked(call, x, y, tier=Tier.COMPILED, races=True)
    assert disk_cache.counts.written == 1 and disk_cache.counts.hits == 0
    again, session = checked(call, x, y, tier=Tier.COMPILED, races=True)
    assert [c.tier for c in session.calls] == ["compiled"] and session.findings == []
    assert disk_cache.counts.hits == 1 and disk_cache.counts.written == 1
    np.testing.assert_array_equal(first, again)
    want = (np.asarray(x) * np.asarray(y)).reshape(32, 4, 128).sum(1)
    np.testing.assert_allclose(again, want, rtol=1e-5, atol=1e-5)


_ENGINE_PROCESS = textwrap.dedent("""
    import json
    import jax, jax.numpy as jnp, numpy as np
    from jax.experimental import pallas as pl
    import pallas_check
    from pallas_check.engine.runtime import disk_cache

    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.tanh(x_ref[...]) * 2.0 + x_ref[...]

    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    call = pl.pallas_call(kernel, grid=(4,), in_specs=[spec], out_specs=spec,
                          out_shape=jax.ShapeDtypeStruct((32, 128), jnp.float32))
    x = jnp.linspace(-3, 3, 32 * 128, dtype=jnp.float32).reshape(32, 128)
    lowered = []

    def listen(event, seconds, **kwargs):
        if event == "/jax/core/compile/jaxpr_to_mlir_module_duration":
            lowered.append(str(kwargs.get("fun_name")))

    jax.monitoring.register_event_duration_secs_listener(listen)
    with pallas_check.checking(tier="engine", project=False) as run:
        out = np.asarray(call(x))
    print(json.dumps({"hits": disk_cache.counts.hits, "written": disk_cache.counts.written,
                      "findings": len(run.findings), "out": out.tolist(),
                      "segments_lowered": lowered.count("jit(run)")}))
""")


def test_the_engines_segments_are_read_back_in_the_next_process(cache_dir):
    """A test suite's next run pays no segment compile, nor the lowering that keyed one:
    the engine's second process finds every segment the first compiled by what it is
    (engine/jaxpr/segment_cache.py), and computes the same outputs."""
    env = {**os.environ, disk_cache.ENV: str(cache_dir)}
    runs = [json.loads(subprocess.run([sys.executable, "-c", _ENGINE_PROCESS], env=env,
                                      check=True, capture_output=True,
                                      text=True).stdout.splitlines()[-1])
            for _ in range(2)]
    written = runs[0]["written"]
    assert written >= 1 and runs[0]["hits"] == 0
    assert (runs[1]["hits"], runs[1]["written"]) == (written, 0)
    assert runs[0]["segments_lowered"] == written and runs[1]["segments_lowered"] == 0
    assert runs[0]["findings"] == runs[1]["findings"] == 0
    x = np.linspace(-3, 3, 32 * 128, dtype=np.float32).reshape(32, 128)
    np.testing.assert_allclose(runs[1]["out"], np.tanh(x) * 2.0 + x, rtol=1e-5, atol=1e-5)
    assert runs[0]["out"] == runs[1]["out"]


def test_programs_that_differ_only_in_an_unused_argument_are_two_entries(cache_dir):
    """XLA's program drops an argument it does not use, so two programs can have one text
    and take different arguments (the tier fuzzer met it: the executable of one was read
    back for the other, which it refused). The signature is part of the key."""
    def program(x, unused):
        return x * 2.0

    with jax.default_device(engine_device()):
        lowered = [jax.jit(program).lower(jax.ShapeDtypeStruct((8, 128), jnp.float32),
                                          jax.ShapeDtypeStruct(shape, jnp.float32))
                   for shape in ((1, 205, 35), (1, 35, 205))]
    assert lowered[0].as_text() == lowered[1].as_text()
    first = disk_cache.compile_cached(lowered[0], engine_device())
    second = disk_cache.compile_cached(lowered[1], engine_device())
    assert disk_cache.counts.hits == 0 and len(list(cache_dir.glob("*.xla"))) == 2
    np.testing.assert_array_equal(np.asarray(second(X, np.zeros((1, 35, 205), np.float32))),
                                  X * 2.0)
    np.testing.assert_array_equal(np.asarray(first(X, np.zeros((1, 205, 35), np.float32))),
                                  X * 2.0)
