"""The script's plain programs kept across processes (jaxbridge/program_store.py, with
engine/runtime/disk_cache.py `ScriptPrograms`), and what JAX keeps of them between two
sessions of one process (jaxbridge/lowering.py `end_programs`): a plain program is
compiled once per machine and lowered once per process, a program holding a kernel never
outlives the session that lowered it, and xdist workers share one folder."""

from __future__ import annotations

import importlib.util
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
from jax.experimental import pallas as pl
from jax.experimental import serialize_executable

import pallas_check
from pallas_check.engine.runtime import disk_cache
from pallas_check.findings.finding import FindingKind
from pallas_check.jaxbridge import program_store

from _jax_events import LOWERED, events

pytest_plugins = ["pytester"]

_CASES = Path(__file__).resolve().parent / "_program_cases.py"
_ROOT = Path(__file__).resolve().parents[2]
_KEYED = ["large_constant", "literal", "dtype", "donation", "branch", "loop_literal"]


# A script as a test suite's process runs it: plain programs (a reference, a random
# draw) and a kernel that leaves half its output unwritten, in a checking block.
_PROCESS = textwrap.dedent("""
    import json
    import jax, jax.numpy as jnp, numpy as np
    from jax.experimental import pallas as pl
    import pallas_check
    from pallas_check.jaxbridge import program_store

    lowered = []
    def listen(event, seconds, **kwargs):
        if event == "/jax/core/compile/jaxpr_to_mlir_module_duration":
            lowered.append(str(kwargs.get("fun_name")))
    jax.monitoring.register_event_duration_secs_listener(listen)

    def half(x_ref, o_ref):
        o_ref[:4, :] = x_ref[:4, :] * 2.0

    call = pl.pallas_call(half, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))
    with pallas_check.checking(project=False, races=False, chip_compile=False) as run:
        x = jax.random.normal(jax.random.key(7), (8, 128), jnp.float32)
        reference = jnp.tanh(x) * 3.0 + jnp.exp(-x)
        out = jax.jit(call)(x)
        jax.block_until_ready(out)
    counts = program_store.counts
    print(json.dumps({
        "hits": counts.hits, "misses": counts.misses,
        "identity_hits": counts.identity_hits, "identity_misses": counts.identity_misses,
        "identity_refused": counts.identity_refused, "refusals": dict(counts.refusals),
        "lowered": lowered,
        "reference": np.asarray(reference).ravel()[:8].tolist(),
        "rows": np.asarray(out)[:4].ravel()[:8].tolist(),
        "findings": [f.kind.value for f in run.findings]}))
""")


def _run(cache: Path) -> dict:
    env = {**os.environ, disk_cache.ENV: str(cache)}
    done = subprocess.run([sys.executable, "-c", _PROCESS], env=env, capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def test_a_plain_program_compiled_in_one_process_is_read_back_in_the_next(tmp_path):
    """The second process neither lowers nor compiles any of the script's plain programs
    (each is found by what it is, before lowering, and computes what the compile did),
    while its kernel's program is lowered and checked by its own session: the same
    finding, the same values."""
    first, second = _run(tmp_path / "cache"), _run(tmp_path / "cache")
    assert first["identity_hits"] == 0 and first["identity_misses"] >= 3, first
    assert (second["identity_hits"], second["identity_misses"]) == (
        first["identity_misses"], 0), second
    # Only the program holding the kernel is lowered again (it runs this session's
    # interception): refused a key, by its pallas_call.
    assert second["refusals"] == first["refusals"] == {
        "primitive pallas_call": first["identity_refused"]}, second
    assert second["lowered"] == ["jit(wrapped)"] * first["identity_refused"], second
    assert len(first["lowered"]) > first["identity_misses"]
    assert second["misses"] == 0  # (nothing compiled either)
    assert second["reference"] == first["reference"]
    assert second["rows"] == first["rows"]
    assert first["findings"] == second["findings"] == [FindingKind.UNWRITTEN_OUTPUT.value]
    stored = list((tmp_path / "cache" / "programs").glob("*.xla"))
    assert len(stored) == first["identity_misses"] + first["misses"]
    assert not list((tmp_path / "cache" / "programs").glob("*.tmp"))


@pytest.mark.parametrize("setting", ["off", "jax-cache"])
def test_off_or_jaxs_own_cache_stores_nothing(tmp_path, setting):
    """`PALLAS_CHECK_CACHE_DIR=off`: the hook is not installed. A script that set up JAX's
    persistent cache keeps it: the store stands aside. Either way JAX compiles as always."""
    env = {**os.environ, disk_cache.ENV: str(tmp_path / "cache")}
    if setting == "off":
        env[disk_cache.ENV] = "off"
    else:
        env["JAX_COMPILATION_CACHE_DIR"] = str(tmp_path / "jax")
    done = subprocess.run([sys.executable, "-c", _PROCESS], env=env, capture_output=True,
                          text=True, check=True)
    found = json.loads(done.stdout.splitlines()[-1])
    assert (found["hits"], found["misses"]) == (0, 0)
    assert (found["identity_hits"], found["identity_misses"]) == (0, 0)
    assert found["findings"] == [FindingKind.UNWRITTEN_OUTPUT.value]
    assert not (tmp_path / "cache" / "programs").exists()


class _Memory:
    """A store in memory (what the hook asked and kept)."""

    def __init__(self) -> None:
        self.kept: dict[str, bytes] = {}
        self.asked = 0
        self.keys_asked: list[str] = []

    def get(self, key: str) -> bytes | None:
        self.asked += 1
        self.keys_asked.append(key)
        return self.kept.get(key)

    def put(self, key: str, data: bytes) -> None:
        self.kept[key] = data

    def discard(self, key: str) -> None:
        self.kept.pop(key, None)

    def identity_key(self, identity: str) -> str:
        return "identity " + identity


def _double(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0


def test_a_program_holding_a_kernel_is_never_offered_to_the_store(tmp_path, monkeypatch):
    """The kernel's program (it calls this session's interception) is compiled as JAX
    would, never looked up nor kept; the session's plain programs are."""
    monkeypatch.setenv(disk_cache.ENV, str(tmp_path / "cache"))
    kernel_programs: list[object] = []
    said = program_store._lowering.kernel_module

    def spy(module: object) -> bool:
        answer = said(module)
        if answer:
            kernel_programs.append(module)
        return answer

    monkeypatch.setattr(program_store._lowering, "kernel_module", spy)
    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
    kernel = jax.jit(pl.pallas_call(_double, out_shape=jax.ShapeDtypeStruct((8, 128),
                                                                            jnp.float32)))
    kept = program_store.counts.misses + program_store.counts.identity_misses
    # The engine's program calls back into the session; the compiled tier's runs the
    # kernel inline, with custom calls into this session's interception.
    for tier, calls in (("engine", 1), ("compiled", 2)):
        with pallas_check.checking(project=False, races=False, chip_compile=False,
                                   tier=tier) as run:
            y = jnp.cos(x) * 11.0
            for _ in range(calls):
                np.testing.assert_array_equal(np.asarray(kernel(y)), 2.0 * np.asarray(y))
        assert [c.tier for c in run.calls][-1] == tier
    assert len(kernel_programs) >= 2
    # (the plain ones were kept)
    assert program_store.counts.misses + program_store.counts.identity_misses > kept
    assert not program_store.installed()  # (the session's store goes with it)


def test_a_torn_entry_is_discarded_and_compiled_again():
    """An entry that cannot be loaded (a torn file, another build's) is compiled again and
    replaced; the program computes what it should."""
    store = _Memory()
    x = jnp.linspace(-1, 1, 8 * 128, dtype=jnp.float32).reshape(8, 128)
    want = np.sin(np.asarray(x)) * 5.0 - 1.0
    program_store.install(store)
    try:
        first = jax.jit(lambda v: jnp.sin(v) * 5.0 - 1.0).lower(x).compile()
        [key] = store.kept
        store.kept[key] = b"torn"
        again = jax.jit(lambda v: jnp.sin(v) * 5.0 - 1.0).lower(x).compile()
    finally:
        program_store.uninstall()
    assert store.kept[key] != b"torn"
    for compiled in (first, again):
        np.testing.assert_allclose(np.asarray(compiled(x)), want, rtol=1e-6, atol=1e-6)


def test_ahead_of_time_lowering_and_compiling_stay_jaxs_own():
    """`jit(f).lower(x).compile()` is never answered by a program's identity, even with
    the program kept by it: the script gets JAX's own lowering (its text) and executable;
    a dispatch of the same program is answered so."""
    store = _Memory()
    x = jnp.linspace(-2, 2, 8 * 128, dtype=jnp.float32).reshape(8, 128)
    want = np.cos(np.asarray(x)) * 9.0 - 2.0

    def program(v: jax.Array) -> jax.Array:
        return jnp.cos(v) * 9.0 - 2.0

    program_store.install(store)
    try:
        np.testing.assert_allclose(np.asarray(jax.jit(program)(x)), want, rtol=1e-6,
                                   atol=1e-6)
        assert any(k.startswith("identity ") for k in store.kept)
        store.keys_asked.clear()
        with events(LOWERED) as lowered:
            ahead = jax.jit(lambda v: jnp.cos(v) * 9.0 - 2.0).lower(x)
        assert "cosine" in ahead.as_text() and lowered == ["jit(<lambda>)"]
        compiled = ahead.compile()
        asked = list(store.keys_asked)
    finally:
        program_store.uninstall()
    np.testing.assert_allclose(np.asarray(compiled(x)), want, rtol=1e-6, atol=1e-6)
    assert asked and not any(k.startswith("identity ") for k in asked), asked


def test_a_plain_program_is_lowered_once_across_sessions_and_a_kernels_each_session():
    """What JAX's Python dispatch keeps between two sessions of one process (a test suite's
    tests): a plain program lowered ahead of time in the first is not lowered again in the
    second; a program holding a kernel is (it runs the first session's callbacks)."""
    x = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    plain = jax.jit(lambda v: jnp.cos(v) * 7.0)
    kernel = jax.jit(pl.pallas_call(_double, out_shape=x))
    lowered: list[list[str]] = []
    for _ in range(2):
        with events(LOWERED) as names, pallas_check.checking(
                project=False, races=False, chip_compile=False):
            plain.lower(x)
            kernel.lower(x)
        lowered.append(names)
    first, second = lowered
    assert sorted(first) == ["jit(<lambda>)", "jit(wrapped)"], first  # (pallas_call's jit)
    assert second == ["jit(wrapped)"], second


SHARED_SUITE = """\
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl


def scale(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 3.0


@pytest.mark.parametrize("n", range(6))
def test_same_programs(n):
    x = jax.random.normal(jax.random.key(n % 2), (16, 128), jnp.float32)
    reference = jnp.tanh(x) * 3.0 + jnp.exp(-jnp.abs(x))
    out = pl.pallas_call(scale, out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32))(x)
    np.testing.assert_allclose(np.asarray(out), 3.0 * np.asarray(x), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(reference),
                               np.tanh(np.asarray(x)) * 3.0 + np.exp(-np.abs(np.asarray(x))),
                               rtol=1e-5, atol=1e-5)
"""


def test_xdist_workers_share_one_folder(pytester, tmp_path, monkeypatch):
    """Three xdist workers compiling the same programs at once into one empty folder, then
    a second run of the suite from it: every test passes both times, no entry is half
    written, and each entry left is one JAX loads and runs."""
    if importlib.util.find_spec("xdist") is None:
        pytest.skip("pytest-xdist is not installed (it is in the test extra)")
    cache = tmp_path / "shared"
    monkeypatch.setenv(disk_cache.ENV, str(cache))
    pytester.makepyfile(test_shared=SHARED_SUITE)
    for _ in range(2):
        result = pytester.runpytest_subprocess("--pallas-check", "-n", "3",
                                               "-p", "no:cacheprovider")
        result.assert_outcomes(passed=6)
    programs = cache / "programs"
    entries = list(programs.glob("*.xla"))
    assert entries and not list(programs.glob("*.tmp"))
    for entry in entries:  # whole: each deserializes (a torn one would raise)
        _load_entry(entry.read_bytes())


def _load_entry(data: bytes) -> object:
    """An entry of either kind loaded: JAX's executable kept under JAX's key, or the loaded
    executable (pickled by jax.experimental.serialize_executable) kept before lowering."""
    from jax._src.lib import xla_client

    device = jax.devices("cpu")[0]
    if data.startswith(b"\x80"):  # (a pickle)
        return serialize_executable.deserialize_and_load(
            data, jax.tree_util.tree_structure(((), {})), jax.tree_util.tree_structure(()),
            backend=device.client, execution_devices=[device])
    devices, options = xla_client.DeviceList((device,)), xla_client.CompileOptions()
    return device.client.deserialize_executable(data, devices, options)


def test_two_processes_filling_one_folder_at_once_both_succeed(tmp_path):
    """Two processes keeping the same programs into one empty folder at the same time
    (atomic writes: each entry is whole, whoever wrote it last), then a third that finds
    every one of them without lowering; all compute their references."""
    cache = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    argv = [sys.executable, str(_CASES), str(cache), "a", *_KEYED]
    both = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for _ in range(2)]
    outputs = [p.communicate() for p in both]
    assert [p.returncode for p in both] == [0, 0], [err[-2000:] for _, err in outputs]
    third = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    runs = [json.loads(out.splitlines()[-1]) for out, _ in outputs]
    runs.append(json.loads(third.stdout.splitlines()[-1]))
    for name in _KEYED:
        for run in runs:
            np.testing.assert_allclose(run[name]["out"], run[name]["want"], rtol=1e-6,
                                       err_msg=name)
        assert (runs[2][name]["identity_hits"], runs[2][name]["lowered"]) == (1, []), name
    programs = cache / "programs"
    assert not list(programs.glob("*.tmp"))
    for entry in programs.glob("*.xla"):
        _load_entry(entry.read_bytes())
