"""Concurrency: determinism, replay of a found schedule, deadlocks that end, schedule
exploration, and per-core memory.

Runs that need several CPU devices (or must be byte-compared, or must not hang the test
process) go through `python -m pallas_check` in a subprocess; the rest run in-process.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_check.config import Config

ROOT = Path(__file__).resolve().parents[3]
SHARED_SEM = "samples/shared_sem_bug.py"
EXPLORE = ["--dma", "random", "--races", "--schedules", "20"]


def _cli(argv: list[str], report: Path, timeout: float = 120) -> tuple[int, dict, str]:
    """`argv` is a full command whose first word is `pallas-check`; it runs from the
    repository root (the samples' paths are relative to it) with a JSON report."""
    assert argv[0] == "pallas-check", argv
    cmd = [sys.executable, "-m", "pallas_check", *argv[1:], "--format", "json",
           "--output", str(report)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert report.exists(), proc.stdout + proc.stderr
    return proc.returncode, json.loads(report.read_text()), proc.stdout + proc.stderr


def _run(args: str, report: Path) -> tuple[int, dict, str]:
    return _cli(["pallas-check", "run", *shlex.split(args)], report)


def _races(report: dict) -> list[dict]:
    return [f for f in report["findings"] if f["kind"] == "race"]


def _signature(finding: dict) -> tuple:
    """What makes a race the same race: kind, buffer, range, both accesses' lines, seed."""
    return (finding["kind"], finding["buffer"], finding["index_range"],
            sorted((a["operation"], a["frames"][0]["line"]) for a in finding["accesses"]),
            finding["seed"])


# -- (a) determinism -------------------------------------------------------------------------

@pytest.mark.parametrize("args", [
    "samples/remote_no_barrier_bug.py --devices 2 --races --dma random --schedules 10"
    " --keep-going",
    f"{SHARED_SEM} {' '.join(EXPLORE)}",
], ids=["remote_no_barrier_2dev", "shared_sem_schedules"])
def test_same_command_gives_byte_identical_json(tmp_path, args):
    reports = [tmp_path / "first.json", tmp_path / "second.json"]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda r: _run(args, r), reports))
    assert [code for code, _, _ in results] == [1, 1], results[0][2]
    assert _races(results[0][1]), "the sample's race was not found"
    assert reports[0].read_bytes() == reports[1].read_bytes()


# -- (b) replay round trip -------------------------------------------------------------------

def test_replay_command_reproduces_the_race(tmp_path):
    """Explore from seed 3 (the first seeds happen to be clean), take the race's printed
    replay command, run exactly that, and get the same race under the same seed."""
    code, found, output = _run(f"{SHARED_SEM} {' '.join(EXPLORE)} --seed 3",
                               tmp_path / "explore.json")
    assert code == 1, output
    (race,) = [f for f in _races(found) if f["buffer"] == "buf"]
    assert 3 <= race["seed"] < 23
    replay = race["replay"]
    assert f"--seed {race['seed']}" in replay and "--schedules" not in replay, replay
    code, replayed, output = _cli(shlex.split(replay), tmp_path / "replay.json")
    assert code == 1, output
    assert replayed["config"]["seed"] == race["seed"]
    assert replayed["config"]["schedules"] == 1
    assert _signature(race) in [_signature(f) for f in _races(replayed)], (
        _signature(race), [_signature(f) for f in _races(replayed)])
    (again,) = [f for f in _races(replayed) if _signature(f) == _signature(race)]
    assert again["replay"] == replay


# -- (c) deadlocks end, with every blocked actor named ----------------------------------------

ONE_SIDED_DEADLOCK = textwrap.dedent('''
    """Device 0 waits on a semaphore that only device 1 could signal; device 1 never does."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu
    from jax.sharding import NamedSharding, PartitionSpec as P


    def kernel(x_ref, o_ref, ready):
        o_ref[...] = x_ref[...] * 2.0

        @pl.when(lax.axis_index("x") == 0)
        def _():
            pl.semaphore_wait(ready, 1)


    def call(x):
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[pl.BlockSpec((8, 128), lambda: (0, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda: (0, 0)),
            scratch_shapes=[pltpu.SemaphoreType.REGULAR])(x)


    mesh = jax.make_mesh((2,), ("x",))
    x = jax.device_put(jnp.ones((16, 128), jnp.float32), NamedSharding(mesh, P("x")))
    jax.jit(jax.shard_map(call, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                          check_vma=False))(x).block_until_ready()
''')


def _deadlock_run(args: str, report: Path) -> dict:
    code, data, output = _run(args, report)
    # Found by the scheduler (no actor can move), not by a clock: the run finished with
    # its report, where the watchdog would have stopped a stuck run part way.
    assert data["partial"] is False and data["user_error"] is None, output
    assert code == 1, output
    (deadlock,) = [f for f in data["findings"] if f["kind"] == "deadlock"]
    return deadlock


@pytest.mark.parametrize("args,blocked,line", [
    ("samples/deadlock_bug.py", {"core 0"}, 23),
    ("samples/remote_deadlock_bug.py --devices 2", {"device 0 core 0", "device 1 core 0"},
     32),
    ("{one_sided} --devices 2", {"device 0 core 0"}, 16),
], ids=["deadlock_bug", "remote_deadlock_2dev", "one_sided_2dev"])
def test_a_deadlock_is_found_naming_every_blocked_actor(tmp_path, args, blocked, line):
    script = tmp_path / "one_sided_deadlock.py"
    script.write_text(ONE_SIDED_DEADLOCK)
    deadlock = _deadlock_run(args.format(one_sided=script), tmp_path / "report.json")
    actors = {a["actor"] for a in deadlock["accesses"]}
    assert actors == blocked, deadlock["message"]
    for actor in blocked:
        assert f"{actor} waits" in deadlock["message"]
    assert all(a["operation"] == "wait" for a in deadlock["accesses"])
    assert {a["frames"][0]["line"] for a in deadlock["accesses"]} == {line}
    assert deadlock["frames"][0]["line"] == line


# -- (d) a bug only some schedules expose ---------------------------------------------------

def test_schedule_dependent_race_missed_by_one_run_found_by_exploration(tmp_path):
    """shared_sem_bug: with --dma eager each copy has landed when it starts, so the shared
    semaphore cannot be satisfied by the wrong copy; one random schedule (seed 3) happens
    to land slot 0 in time too. Exploring 20 schedules from seed 3 finds the race."""
    runs = {
        "eager": f"{SHARED_SEM} --dma eager --races",
        "random, one schedule": f"{SHARED_SEM} --dma random --races --seed 3",
        "random, 20 schedules": f"{SHARED_SEM} {' '.join(EXPLORE)} --seed 3",
    }
    with ThreadPoolExecutor(len(runs)) as pool:
        results = dict(zip(runs, pool.map(
            lambda item: _run(item[1], tmp_path / f"{item[0].replace(' ', '_')}.json"),
            runs.items())))
    for name in ("eager", "random, one schedule"):
        code, data, output = results[name]
        assert code == 0 and data["findings"] == [], (name, output)
        assert "output matches" in output, (name, output)
    code, data, output = results["random, 20 schedules"]
    assert code == 1, output
    race = next(f for f in _races(data) if f["buffer"] == "buf")
    assert race["index_range"] == [[0, 1], [0, 8], [0, 128]]
    assert race["seed"] > 3  # found by a later schedule than the one run alone


# -- (e) per-core VMEM is private -------------------------------------------------------------

def _two_core_scratch_call(space):
    def kernel(x_ref, o_ref, scratch):
        scratch[...] = x_ref[...] * 2.0  # both cores write the same indices of "scratch"
        o_ref[...] = scratch[...] + 1.0

    def call(x):
        return pl.pallas_call(
            kernel,
            grid=(2,),
            in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            scratch_shapes=[space((8, 128), jnp.float32)],
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        )(x)

    return call


def test_per_core_vmem_scratch_is_private(check):
    x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
    config = Config(cores=2, races=True)
    private = check(_two_core_scratch_call(pltpu.VMEM), x, config=config)
    assert private.findings == [], [f.message for f in private.findings]
    np.testing.assert_allclose(private.value, x * 2.0 + 1.0)
    # The same kernel with the scratch in VMEM_SHARED (one buffer for both cores) races:
    # the check above is not vacuous.
    shared = check(_two_core_scratch_call(pltpu.VMEM_SHARED), x, config=config)
    races = [f for f in shared.findings if f.kind.value == "race"]
    assert races and {f.buffer for f in races} == {"scratch"}
    assert {a.actor for f in races for a in f.accesses} == {"core 0", "core 1"}
