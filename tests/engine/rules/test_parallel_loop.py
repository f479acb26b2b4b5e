"""`plsc.parallel_loop` (engine/rules/sparsecore.py): iterations run in order for their
values (only the carry chains them), and for the race checker each iteration is an actor of
its own, forked from the subcore when the loop begins and joined when it ends: the chip may
overlap or reorder iterations, so a read of another iteration's write is a race (JAX's
docstring: "Unsafe read of 'previous' iteration's write"), and so are overlapping writes.
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

import pallas_check
from pallas_check.findings.finding import FindingKind

NSUB, CHUNKS = 4, 4


def _line(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def _checked(build, *args, **options):
    # The engine's race detection, not the chip's compile (which refuses the overlapping
    # variant's concatenation of two vectors on a v6e SparseCore before it could race).
    options.setdefault("chip_compile", False)
    with pallas_check.checking(tpu="v6e", races=True, project=False, **options) as run:
        out = jax.block_until_ready(build(*args))
    return out, run


def scaled(x, bug: str = ""):
    """Subcore s scales its CHUNKS vectors by (chunk index + 1) in a parallel_loop, whose
    carry counts the iterations; bug="read": each iteration also reads chunk 0 (iteration
    0's write); bug="overlap": each iteration writes 2 vectors (step < width)."""
    L = pltpu.get_tpu_info().sparse_core.num_lanes
    n = CHUNKS * L
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=1, num_subcores=NSUB)

    @pl.kernel(out_type=(jax.ShapeDtypeStruct((NSUB * n,), jnp.float32),
                         jax.ShapeDtypeStruct((NSUB, L), jnp.int32)), mesh=mesh,
               scratch_types=[pltpu.VMEM((n + L,), jnp.float32), pltpu.VMEM((1, L), jnp.int32)])
    def kernel(x_hbm, o_hbm, count_hbm, x_v, count_v):
        s = jax.lax.axis_index("subcore")
        pltpu.sync_copy(x_hbm.at[pl.ds(s * n, n)], x_v.at[pl.ds(0, n)])
        x_v[pl.ds(n, L)] = jnp.zeros((L,), jnp.float32)

        @plsc.parallel_loop(0, n, L, carry=jnp.int32(0))
        def count(i, k):
            v = x_v[pl.ds(i, L)] * (k + 1).astype(jnp.float32)
            if bug == "read":
                v = v + 0.0 * x_v[pl.ds(0, L)]  # READS ITERATION 0'S CHUNK
            if bug == "overlap":
                x_v[pl.ds(i, 2 * L)] = jnp.concatenate([v, v])  # WRITES TWO CHUNKS
            else:
                x_v[pl.ds(i, L)] = v  # WRITES ITS CHUNK
            return k + 1

        count_v[...] = jnp.full((1, L), count, jnp.int32)
        pltpu.sync_copy(x_v.at[pl.ds(0, n)], o_hbm.at[pl.ds(s * n, n)])
        pltpu.sync_copy(count_v, count_hbm.at[pl.ds(s, 1)])

    return kernel(x)


def _x() -> jnp.ndarray:
    return jnp.arange(NSUB * CHUNKS * 8, dtype=jnp.float32) % 11


def test_a_clean_parallel_loop_matches_numpy_with_its_carry():
    (out, count), run = _checked(scaled, _x())
    assert run.findings == []
    want = np.asarray(_x()).reshape(NSUB, CHUNKS, 8) * np.arange(1, CHUNKS + 1)[None, :, None]
    np.testing.assert_allclose(np.asarray(out), want.reshape(-1))
    np.testing.assert_array_equal(np.asarray(count), CHUNKS)


def test_a_read_of_another_iterations_write_is_a_race():
    _, run = _checked(lambda x: scaled(x, bug="read"), _x())
    races = [f for f in run.findings if f.kind == FindingKind.RACE]
    assert races, run.findings
    for race in races:
        assert race.buffer == "x_v" and race.index_range == ((0, 8),)
        assert {a.frames[0].line for a in race.accesses} == {
            _line(scaled, "# READS ITERATION 0'S CHUNK"), _line(scaled, "# WRITES ITS CHUNK")}
        actors = {a.actor for a in race.accesses}
        assert any("(parallel_loop iteration i=0)" in a for a in actors), actors
        assert any("(parallel_loop iteration i=" in a and "i=0)" not in a for a in actors)


def test_overlapping_writes_of_two_iterations_race():
    _, run = _checked(lambda x: scaled(x, bug="overlap"), _x())
    races = [f for f in run.findings if f.kind == FindingKind.RACE]
    assert races, run.findings
    line = _line(scaled, "# WRITES TWO CHUNKS")
    for race in races:  # the second chunk written by one iteration is the next one's
        assert race.buffer == "x_v" and line in {a.frames[0].line for a in race.accesses}
        (lo, hi), = race.index_range
        assert hi - lo == 8 and lo % 8 == 0 and 8 <= lo < CHUNKS * 8
    assert any({a.frames[0].line for a in race.accesses} == {line} for race in races)


def test_without_races_the_loop_runs_as_is():
    with pallas_check.checking(tpu="v6e", project=False) as run:
        out, count = jax.block_until_ready(scaled(_x()))
    assert run.findings == []
    np.testing.assert_array_equal(np.asarray(count), CHUNKS)
