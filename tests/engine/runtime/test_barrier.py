"""SparseCore synchronisation (issue 28): `plsc.subcore_barrier()` (engine/runtime/barrier.py,
the rule in engine/rules/sparsecore.py), `plsc.fetch_and_add`, and a `pl.semaphore_signal`
naming another subcore, which Mosaic lowers to a local signal.

Each kernel runs under `pallas_check.checking(tpu="v6e")` (a SparseCore mesh needs a chip
with SparseCores: v6e has 2 x 16 subcores, 8 lanes) with races on; outputs are compared
with numpy, findings by kind, buffer, range and line.
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


def _mesh(num_cores: int = 1, num_subcores: int = 16):
    return plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=num_cores, num_subcores=num_subcores)


def _lanes() -> int:
    return pltpu.get_tpu_info().sparse_core.num_lanes


def _line(fn, text: str) -> int:
    """The file line of the first line of `fn` holding `text`."""
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def _checked(build, *args, **options):
    """Run `build(*args)` (which makes its mesh, so inside the block) under pallas-check."""
    with pallas_check.checking(tpu="v6e", races=True, project=False, **options) as run:
        out = jax.block_until_ready(build(*args))
    return out, run


# -- partial sums through VMEM_SHARED, two phases between barriers -----------------------------

NSUB, CHUNK = 16, 4


def rotate_sum(x, second_barrier: bool = True):
    """Subcore s sums its CHUNK vectors into a_sh[s]; barrier; it reads its neighbour's row
    a_sh[(s+1) % n], scales it by s+1 into b_sh[s]; barrier; subcore 0 sums b_sh."""
    L = _lanes()

    @pl.kernel(out_type=jax.ShapeDtypeStruct((L,), jnp.float32), mesh=_mesh(),
               scratch_types=[pltpu.VMEM((CHUNK * L,), jnp.float32),
                              pltpu.VMEM((1, L), jnp.float32),
                              pltpu.VMEM((NSUB, L), jnp.float32),
                              pltpu.VMEM((L,), jnp.float32),
                              pltpu.VMEM_SHARED((NSUB, L), jnp.float32),
                              pltpu.VMEM_SHARED((NSUB, L), jnp.float32)])
    def kernel(x_hbm, o_hbm, x_v, row_v, all_v, out_v, a_sh, b_sh):
        s = jax.lax.axis_index("subcore")
        pltpu.sync_copy(x_hbm.at[pl.ds(s * CHUNK * L, CHUNK * L)], x_v)
        acc = jnp.zeros((L,), jnp.float32)
        for c in range(CHUNK):
            acc = acc + x_v[pl.ds(c * L, L)]
        row_v[0, :] = acc
        pltpu.sync_copy(row_v, a_sh.at[pl.ds(s, 1)])
        plsc.subcore_barrier()
        pltpu.sync_copy(a_sh.at[pl.ds((s + 1) % NSUB, 1)], row_v)
        row_v[0, :] = row_v[0, :] * (s + 1).astype(jnp.float32)
        pltpu.sync_copy(row_v, b_sh.at[pl.ds(s, 1)])
        if second_barrier:
            plsc.subcore_barrier()

        @pl.when(s == 0)
        def _():
            pltpu.sync_copy(b_sh, all_v)  # READ B_SH
            tot = jnp.zeros((L,), jnp.float32)
            for r in range(NSUB):
                tot = tot + all_v[r, :]
            out_v[...] = tot
            pltpu.sync_copy(out_v, o_hbm)

    return kernel(x)


def rotate_sum_reference(x: np.ndarray, lanes: int) -> np.ndarray:
    parts = x.reshape(NSUB, CHUNK, lanes).sum(1)
    return sum((s + 1) * parts[(s + 1) % NSUB] for s in range(NSUB))


def _x(lanes: int = 8) -> jnp.ndarray:
    return jnp.arange(NSUB * CHUNK * lanes, dtype=jnp.float32) % 13


def test_partial_sums_between_barriers_match_numpy_and_are_clean():
    out, run = _checked(rotate_sum, _x())
    np.testing.assert_allclose(np.asarray(out), rotate_sum_reference(np.asarray(_x()), 8))
    assert run.findings == []


def test_partial_sums_clean_under_random_dma_schedules():
    out, run = _checked(rotate_sum, _x(), dma="random", schedules=5)
    np.testing.assert_allclose(np.asarray(out), rotate_sum_reference(np.asarray(_x()), 8))
    assert run.findings == []


def test_missing_second_barrier_races_on_the_shared_rows():
    _, run = _checked(lambda x: rotate_sum(x, second_barrier=False), _x())
    races = [f for f in run.findings if f.kind == FindingKind.RACE]
    # (subcore 0 may read rows not yet written at all: those reach the output uninitialized)
    assert races and {f.kind for f in run.findings} <= {
        FindingKind.RACE, FindingKind.UNINITIALIZED}, run.findings
    read_line = _line(rotate_sum, "# READ B_SH")
    write_line = _line(rotate_sum, "b_sh.at[pl.ds(s, 1)]")
    for race in races:
        assert race.buffer == "b_sh"
        (lo, hi), cols = race.index_range
        assert hi == lo + 1 and 1 <= lo < NSUB and cols == (0, 8)  # one row, not subcore 0's
        assert {race.location.line, *(a.frames[0].line for a in race.accesses)} == {
            read_line, write_line}


# -- a barrier some subcore never reaches ------------------------------------------------------

def barrier_skipped_by_subcore_3():
    L = _lanes()

    @pl.kernel(out_type=jax.ShapeDtypeStruct((4, L), jnp.float32), mesh=_mesh(1, 4),
               scratch_types=[pltpu.VMEM((1, L), jnp.float32)])
    def kernel(o_hbm, v):
        s = jax.lax.axis_index("subcore")
        v[...] = jnp.zeros((1, L), jnp.float32)

        @pl.when(s != 3)
        def _():
            plsc.subcore_barrier()  # THE BARRIER

        pltpu.sync_copy(v, o_hbm.at[pl.ds(s, 1)])

    return kernel()


def test_a_barrier_one_subcore_skips_is_a_deadlock_naming_it():
    _, run = _checked(barrier_skipped_by_subcore_3)
    [finding] = run.findings
    assert finding.kind == FindingKind.DEADLOCK
    assert finding.location.line == _line(barrier_skipped_by_subcore_3, "# THE BARRIER")
    assert "3 of 4 subcores of device 0 sparsecore 0 wait at the subcore barrier" in (
        finding.message)
    assert "subcore 3" in finding.message
    assert "never arrives: it finished without reaching the barrier" in finding.message
    assert len(finding.accesses) == 3  # the three waiters


# -- one SparseCore's barrier does not order another's subcores --------------------------------

def barrier_per_core():
    """Subcore 0 of each core writes row `core` of the output; barrier; subcore 1 of each
    core reads row 0 (written by core 0's subcore 0): ordered on core 0 only."""
    L = _lanes()

    @pl.kernel(out_type=jax.ShapeDtypeStruct((4, L), jnp.float32), mesh=_mesh(2, 2),
               scratch_types=[pltpu.VMEM((1, L), jnp.float32)])
    def kernel(o_hbm, v):
        c = jax.lax.axis_index("core")
        s = jax.lax.axis_index("subcore")

        @pl.when(s == 0)
        def _():
            v[...] = jnp.full((1, L), 1.0, jnp.float32) + c.astype(jnp.float32)
            pltpu.sync_copy(v, o_hbm.at[pl.ds(c, 1)])  # WRITE ROW c

        plsc.subcore_barrier()

        @pl.when((s == 1) & (c == 0))
        def _():
            pltpu.sync_copy(o_hbm.at[pl.ds(0, 1)], v)  # CORE 0 READS ROW 0
            pltpu.sync_copy(v, o_hbm.at[pl.ds(2, 1)])

        @pl.when((s == 1) & (c == 1))
        def _():
            pltpu.sync_copy(o_hbm.at[pl.ds(0, 1)], v)  # CORE 1 READS ROW 0
            pltpu.sync_copy(v, o_hbm.at[pl.ds(3, 1)])

    return kernel()


def test_barriers_of_one_core_do_not_order_the_other_core():
    out, run = _checked(barrier_per_core)
    np.testing.assert_allclose(np.asarray(out)[:3], [[1.0] * 8, [2.0] * 8, [1.0] * 8])
    [race] = run.findings
    assert race.kind == FindingKind.RACE and race.buffer == "o_hbm"
    assert race.index_range == ((0, 1), (0, 8))
    lines = {race.location.line, *(a.frames[0].line for a in race.accesses)}
    assert lines == {_line(barrier_per_core, "# CORE 1 READS ROW 0"),
                     _line(barrier_per_core, "# WRITE ROW c")}


# -- fetch_and_add -------------------------------------------------------------------------------

def fetch_and_add_neighbour(init_barrier: bool = True):
    """JAX's own test: each subcore sets its SMEM cell to its id, barrier, adds 10 to its
    neighbour's cell (getting the old value), barrier, reads its own cell."""
    L, n = _lanes(), NSUB

    @pl.kernel(out_type=(jax.ShapeDtypeStruct((n, L), jnp.int32),
                         jax.ShapeDtypeStruct((n, L), jnp.int32)), mesh=_mesh(),
               scratch_types=[pltpu.VMEM((1, L), jnp.int32), pltpu.VMEM((1, L), jnp.int32),
                              pltpu.SMEM((1,), jnp.int32)])
    def kernel(old_hbm, new_hbm, old_v, new_v, cell):
        me = jax.lax.axis_index("subcore")
        cell[0] = me  # SET MY CELL
        if init_barrier:
            plsc.subcore_barrier()
        old = plsc.fetch_and_add(cell.at[0], 10, subcore_id=(me + 1) % n)  # FETCH AND ADD
        plsc.subcore_barrier()
        old_v[...] = jnp.full((1, L), old, jnp.int32)
        new_v[...] = jnp.full((1, L), cell[0], jnp.int32)
        pltpu.sync_copy(old_v, old_hbm.at[pl.ds(me, 1)])
        pltpu.sync_copy(new_v, new_hbm.at[pl.ds(me, 1)])

    return kernel()


def test_fetch_and_add_adds_to_the_neighbour_and_returns_the_old_value():
    (old, new), run = _checked(fetch_and_add_neighbour)
    assert run.findings == []
    np.testing.assert_array_equal(np.asarray(old)[:, 0], (np.arange(NSUB) + 1) % NSUB)
    np.testing.assert_array_equal(np.asarray(new)[:, 0], np.arange(NSUB) + 10)


def test_fetch_and_add_unordered_with_the_owners_write_races():
    _, run = _checked(lambda: fetch_and_add_neighbour(init_barrier=False))
    races = [f for f in run.findings if f.kind == FindingKind.RACE]
    assert races, run.findings
    set_line = _line(fetch_and_add_neighbour, "# SET MY CELL")
    add_line = _line(fetch_and_add_neighbour, "# FETCH AND ADD")
    for race in races:
        assert race.buffer == "cell" and race.index_range == ((0, 1),)
        assert {a.frames[0].line for a in race.accesses} == {set_line, add_line}
        assert {a.operation for a in race.accesses} == {"write", "fetch_and_add"}


def counter():
    """Every subcore takes a ticket from subcore 0's counter: concurrent fetch_and_adds of
    one cell are atomic (no race), the tickets are 0..n-1 in some order."""
    L, n = _lanes(), NSUB

    @pl.kernel(out_type=(jax.ShapeDtypeStruct((n, L), jnp.int32),
                         jax.ShapeDtypeStruct((L,), jnp.int32)), mesh=_mesh(),
               scratch_types=[pltpu.VMEM((1, L), jnp.int32), pltpu.VMEM((L,), jnp.int32),
                              pltpu.SMEM((1,), jnp.int32)])
    def kernel(tickets_hbm, total_hbm, ticket_v, total_v, count):
        me = jax.lax.axis_index("subcore")

        @pl.when(me == 0)
        def _():
            count[0] = 0

        plsc.subcore_barrier()
        ticket = plsc.fetch_and_add(count.at[0], 1, subcore_id=0)
        plsc.subcore_barrier()
        ticket_v[...] = jnp.full((1, L), ticket, jnp.int32)
        pltpu.sync_copy(ticket_v, tickets_hbm.at[pl.ds(me, 1)])

        @pl.when(me == 0)
        def _():
            total_v[...] = jnp.full((L,), count[0], jnp.int32)
            pltpu.sync_copy(total_v, total_hbm)

    return kernel()


def test_concurrent_fetch_and_adds_are_atomic():
    (tickets, total), run = _checked(counter)
    assert run.findings == []
    assert sorted(np.asarray(tickets)[:, 0].tolist()) == list(range(NSUB))
    np.testing.assert_array_equal(np.asarray(total), NSUB)


# -- a signal naming another subcore is local ----------------------------------------------------

def signal_to_subcore_1(wait: bool):
    """Subcore 0 signals `device_id={"core": 0, "subcore": 1}`; subcore 1 waits (or not)."""
    L = _lanes()

    @pl.kernel(out_type=jax.ShapeDtypeStruct((2, L), jnp.float32), mesh=_mesh(1, 2),
               scratch_types=[pltpu.VMEM((1, L), jnp.float32), pltpu.SemaphoreType.REGULAR])
    def kernel(o_hbm, v, sem):
        s = jax.lax.axis_index("subcore")
        v[...] = jnp.zeros((1, L), jnp.float32)

        @pl.when(s == 0)
        def _():
            pl.semaphore_signal(sem, 1, device_id={"core": 0, "subcore": 1})  # SIGNAL
            if not wait:  # then subcore 0 takes its own count back
                pl.semaphore_wait(sem, 1)

        if wait:
            @pl.when(s == 1)
            def _():
                pl.semaphore_wait(sem, 1)  # WAIT

        pltpu.sync_copy(v, o_hbm.at[pl.ds(s, 1)])

    return kernel()


def test_a_signal_naming_another_subcore_is_local_and_the_waiter_hangs():
    _, run = _checked(lambda: signal_to_subcore_1(wait=True))
    kinds = {f.kind: f for f in run.findings}
    assert set(kinds) == {FindingKind.SIGNAL_NOT_REMOTE, FindingKind.DEADLOCK}
    signal = kinds[FindingKind.SIGNAL_NOT_REMOTE]
    assert signal.buffer == "sem"
    assert signal.location.line == _line(signal_to_subcore_1, "# SIGNAL")
    assert "{'core': 0, 'subcore': 1}" in signal.message and "OWN sem" in signal.message
    hang = kinds[FindingKind.DEADLOCK]
    assert hang.location.line == _line(signal_to_subcore_1, "# WAIT")


def test_a_local_signal_its_signaller_consumes_is_found_without_a_hang():
    _, run = _checked(lambda: signal_to_subcore_1(wait=False))
    [signal] = run.findings
    assert signal.kind == FindingKind.SIGNAL_NOT_REMOTE
    assert signal.location.line == _line(signal_to_subcore_1, "# SIGNAL")


# -- semaphores are per subcore, as on TensorCores ------------------------------------------------

def own_semaphores():
    """Each subcore starts a DMA on its own DMA semaphore and counts s+1 on its own regular
    semaphore (signal and wait, no device_id): per-subcore semaphores, never shared."""
    L = _lanes()

    @pl.kernel(out_type=jax.ShapeDtypeStruct((4, L), jnp.float32), mesh=_mesh(1, 4),
               scratch_types=[pltpu.VMEM((1, L), jnp.float32), pltpu.SemaphoreType.DMA,
                              pltpu.SemaphoreType.REGULAR])
    def kernel(x_hbm, o_hbm, v, dma_sem, sem):
        s = jax.lax.axis_index("subcore")
        copy = pltpu.make_async_copy(x_hbm.at[pl.ds(s, 1)], v, dma_sem)
        copy.start()
        pl.semaphore_signal(sem, s + 1)
        pl.semaphore_wait(sem, s + 1)
        copy.wait()
        v[...] = v[...] * 2.0
        pltpu.sync_copy(v, o_hbm.at[pl.ds(s, 1)])

    return kernel(jnp.arange(4 * L, dtype=jnp.float32).reshape(4, L))


def test_each_subcore_has_its_own_semaphores():
    out, run = _checked(own_semaphores, dma="random", schedules=5)
    assert run.findings == []
    np.testing.assert_allclose(np.asarray(out), 2 * np.arange(32, dtype=np.float32).reshape(4, 8))
