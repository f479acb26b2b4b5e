"""SparseCore indirect DMAs (engine/dma/indirect.py, the indirect branch of
engine/rules/dma.py): gathers and scatters through an index vector, `add=True`,
`plsc.Indices(ignored_value=...)` filters, the index vector's bounds, races between
scatters (plain stores race, atomic adds do not), the bytes a filtered DMA signals and its
wait takes, in every DMA mode; and mosaic_limits' SparseCore rules (what still does not
lower)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

from pallas_check.checkers.races import RaceChecker
from pallas_check.engine.events import Access, CallFacts
from pallas_check.config import Config, DmaMode
from pallas_check.findings.finding import FindingKind, KernelInfo, format_range

D = 128  # HBM rows of an indirect DMA are 128-lane aligned (Mosaic SC)
MODES = [DmaMode.EAGER, DmaMode.ON_WAIT, DmaMode.RANDOM]


def _config(mode=DmaMode.ON_WAIT, **kw):
    return Config(tpu="v6e", dma_mode=mode, races=True, **kw)


def _lanes():
    return pltpu.get_tpu_info().sparse_core.num_lanes


def _mesh(nsub):
    return plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=1, num_subcores=nsub)


def _clean(r):
    assert r.session.engine_error is None, r.session.engine_error
    assert r.findings == [], [f.message for f in r.findings]


def _gather_fn(nsub, ignored=None):
    """Each subcore gathers L rows of x by its slice of idx into a VMEM buffer prefilled
    with -1, and copies the buffer out."""
    def fn(x, idx):
        lanes = _lanes()

        @pl.kernel(out_type=jax.ShapeDtypeStruct((nsub * lanes, D), jnp.float32),
                   mesh=_mesh(nsub),
                   scratch_types=[pltpu.VMEM((lanes,), jnp.int32),
                                  pltpu.VMEM((lanes, D), jnp.float32),
                                  pltpu.SemaphoreType.DMA])
        def kernel(x_hbm, idx_hbm, o_hbm, idx_v, rows_v, sem):
            s = jax.lax.axis_index("subcore")
            pltpu.sync_copy(idx_hbm.at[pl.ds(s * lanes, lanes)], idx_v)
            rows_v[...] = jnp.full((lanes, D), -1.0, jnp.float32)
            index = idx_v if ignored is None else plsc.Indices(idx_v, ignored_value=ignored)
            pltpu.async_copy(x_hbm.at[index], rows_v, sem).wait()
            pltpu.sync_copy(rows_v, o_hbm.at[pl.ds(s * lanes, lanes)])

        return kernel(x, idx)
    return jax.jit(fn)


@pytest.mark.parametrize("mode", MODES)
def test_gather_matches_numpy(check, mode):
    x = np.arange(40 * D, dtype=np.float32).reshape(40, D)

    def run(x):
        n = 4 * _lanes()
        idx = (np.arange(n, dtype=np.int32) * 7) % 40
        return _gather_fn(4)(x, jnp.asarray(idx)), idx

    r = check(run, x, config=_config(mode))
    _clean(r)
    out, idx = r.value
    np.testing.assert_array_equal(np.asarray(out), x[idx])


@pytest.mark.parametrize("mode", MODES)
def test_filtered_gather_leaves_ignored_rows_untouched(check, mode):
    x = np.arange(40 * D, dtype=np.float32).reshape(40, D)

    def run(x):
        n = 2 * _lanes()
        idx = (np.arange(n, dtype=np.int32) * 3) % 40
        idx[::3] = -7
        return _gather_fn(2, ignored=-7)(x, jnp.asarray(idx)), idx

    r = check(run, x, config=_config(mode))
    _clean(r)  # no leftover semaphore: the wait took exactly what was moved
    out, idx = r.value
    want = np.full((idx.size, D), -1.0, np.float32)
    keep = idx != -7
    want[keep] = x[idx[keep]]
    np.testing.assert_array_equal(np.asarray(out), want)


def test_filtered_gather_ignored_value_out_of_range_is_not_checked(check):
    """An ignored index is not bounds-checked (here it is past the end of x)."""
    x = np.arange(16 * D, dtype=np.float32).reshape(16, D)

    def run(x):
        idx = np.arange(_lanes(), dtype=np.int32)
        idx[1] = 1000
        return _gather_fn(1, ignored=1000)(x, jnp.asarray(idx))

    _clean(check(run, x, config=_config()))


@pytest.mark.parametrize("mode", MODES)
def test_filtered_gather_of_nothing_is_waited_at_once(check, mode):
    """Every index ignored: the DMA moves and signals nothing, its wait does not block
    (no deadlock), and the destination keeps what it held."""
    x = np.arange(16 * D, dtype=np.float32).reshape(16, D)

    def run(x):
        idx = np.full(2 * _lanes(), -1, np.int32)
        return _gather_fn(2, ignored=-1)(x, jnp.asarray(idx))

    r = check(run, x, config=_config(mode))
    _clean(r)
    assert (np.asarray(r.value) == -1.0).all()


def test_semaphore_counts_the_bytes_moved(check):
    """A filtered gather signals its DMA semaphore with the rows it moved (eager: at the
    start) and its wait takes them off again."""
    x = np.arange(16 * D, dtype=np.float32).reshape(16, D)

    def run(x):
        lanes = _lanes()
        idx = np.arange(lanes, dtype=np.int32)
        idx[[0, 2, 5]] = -1  # 3 ignored rows

        @pl.kernel(out_type=jax.ShapeDtypeStruct((2, lanes), jnp.int32), mesh=_mesh(1),
                   scratch_types=[pltpu.VMEM((lanes,), jnp.int32),
                                  pltpu.VMEM((lanes, D), jnp.float32),
                                  pltpu.VMEM((2, lanes), jnp.int32),
                                  pltpu.SemaphoreType.DMA])
        def kernel(x_hbm, idx_hbm, o_hbm, idx_v, rows_v, cnt_v, sem):
            pltpu.sync_copy(idx_hbm, idx_v)
            copy = pltpu.make_async_copy(
                x_hbm.at[plsc.Indices(idx_v, ignored_value=-1)], rows_v, sem)
            copy.start()
            cnt_v[0, :] = jnp.full((lanes,), pl.semaphore_read(sem), jnp.int32)
            copy.wait()
            cnt_v[1, :] = jnp.full((lanes,), pl.semaphore_read(sem), jnp.int32)
            pltpu.sync_copy(cnt_v, o_hbm)

        return jax.jit(kernel)(x, jnp.asarray(idx)), lanes

    r = check(run, x, config=_config(DmaMode.EAGER))
    _clean(r)
    out, lanes = r.value
    assert np.asarray(out)[:, 0].tolist() == [(lanes - 3) * D * 4, 0]


def _scatter_fn(nsub, add, init=False):
    """Each subcore scatters its L rows of x into the output by its slice of idx. With
    `add`, into a VMEM_SHARED table (Mosaic SparseCore takes `add=True` scatters into
    VMEM_SHARED, not HBM): each subcore zeroes its own rows, a barrier, the adds, a barrier,
    then each copies its rows of the table out (`init` is then implied)."""
    def fn(x, idx):
        lanes = _lanes()
        rows = nsub * lanes

        @pl.kernel(out_type=jax.ShapeDtypeStruct((rows, D), jnp.float32),
                   mesh=_mesh(nsub),
                   scratch_types=[pltpu.VMEM((lanes,), jnp.int32),
                                  pltpu.VMEM((lanes, D), jnp.float32),
                                  pltpu.VMEM_SHARED((rows, D), jnp.float32),
                                  pltpu.SemaphoreType.DMA])
        def kernel(x_hbm, idx_hbm, o_hbm, idx_v, rows_v, table_sh, sem):
            s = jax.lax.axis_index("subcore")
            mine = pl.ds(s * lanes, lanes)
            if add:
                rows_v[...] = jnp.zeros((lanes, D), jnp.float32)
                pltpu.sync_copy(rows_v, table_sh.at[mine])
                plsc.subcore_barrier()
            pltpu.sync_copy(idx_hbm.at[mine], idx_v)
            pltpu.sync_copy(x_hbm.at[mine], rows_v)
            target = table_sh if add else o_hbm
            pltpu.async_copy(rows_v, target.at[idx_v], sem, add=add).wait()
            if add:
                plsc.subcore_barrier()
                pltpu.sync_copy(table_sh.at[mine], rows_v)
                pltpu.sync_copy(rows_v, o_hbm.at[mine])

        return kernel(x, idx)
    return jax.jit(fn)


@pytest.mark.parametrize("mode", MODES)
def test_scatter_matches_numpy(check, mode):
    def run():
        n = 2 * _lanes()
        x = np.arange(n * D, dtype=np.float32).reshape(n, D)
        idx = np.arange(n, dtype=np.int32)[::-1].copy()
        return _scatter_fn(2, add=False)(jnp.asarray(x), jnp.asarray(idx)), x, idx

    r = check(run, config=_config(mode))
    _clean(r)
    out, x, idx = r.value
    want = np.empty_like(x)
    want[idx] = x
    np.testing.assert_array_equal(np.asarray(out), want)


@pytest.mark.parametrize("mode", MODES)
def test_scatter_add_accumulates_duplicates(check, mode):
    def run():
        n = _lanes()
        x = np.arange(n * D, dtype=np.float32).reshape(n, D) % 11
        idx = np.array([3, 3, 0, 3, 1, 0, 7, 3] * (n // 8), np.int32)
        return _scatter_fn(1, add=True, init=True)(jnp.asarray(x), jnp.asarray(idx)), x, idx

    r = check(run, config=_config(mode))
    _clean(r)
    out, x, idx = r.value
    want = np.zeros_like(x)
    np.add.at(want, idx, x)
    np.testing.assert_array_equal(np.asarray(out), want)


def test_out_of_bounds_index_names_the_element(check):
    x = np.arange(16 * D, dtype=np.float32).reshape(16, D)

    def run(x):
        idx = (np.arange(4 * _lanes(), dtype=np.int32) * 3) % 16
        idx[3] = 16
        return _gather_fn(4)(x, jnp.asarray(idx))

    r = check(run, x, config=_config())
    oob = [f for f in r.findings if f.kind is FindingKind.OUT_OF_BOUNDS]
    assert len(oob) == 1, [f.message for f in r.findings]
    (f,) = oob
    assert f.buffer == "x_hbm" and format_range(f.index_range) == "[16, 0:128]"
    assert "index 16 (element 3 of index vector idx_v)" in f.message, f.message
    assert f.frames[0].code.strip().startswith("pltpu.async_copy(x_hbm.at[index]")
    assert "subcore" in f.actor or "core" in f.actor


def _scatter_to_row_5(check, add):
    def run():
        n = 2 * _lanes()
        x = np.ones((n, D), np.float32)
        idx = np.arange(n, dtype=np.int32)[::-1].copy()
        idx[0] = idx[n // 2] = 5
        return _scatter_fn(2, add=add)(jnp.asarray(x), jnp.asarray(idx))

    r = check(run, config=_config())
    assert r.session.engine_error is None, r.session.engine_error
    return [f for f in r.findings if f.kind is FindingKind.RACE]


def test_two_plain_scatters_to_one_row_race(check):
    races = _scatter_to_row_5(check, add=False)
    assert len(races) == 1, [f.message for f in races]
    assert races[0].buffer == "o_hbm" and format_range(races[0].index_range) == "[5, 0:128]"
    assert "DMA write" in races[0].message


def test_two_scatter_adds_to_one_row_do_not_race(check):
    assert _scatter_to_row_5(check, add=True) == []


class _Found(list):
    def emit(self, finding):
        self.append(finding)


def _add(checker, actor, rng, operation="DMA add", atomic_add=True):
    checker.on_access(Access(actor, 1, "o", "HBM", rng, True, operation, (), None,
                             atomic_add))


def test_race_checker_atomic_adds():
    """Atomic adds never race with each other; an add races with a plain write; a later
    add covering an unordered plain write does not hide that write from the next add."""
    found = _Found()
    checker = RaceChecker(CallFacts(KernelInfo("kernel"), 0, None, True), found)
    rng = ((0, 8),)
    _add(checker, "a", rng)
    _add(checker, "b", rng)
    assert found == []
    _add(checker, "c", rng, "DMA write", atomic_add=False)
    assert len(found) == 2  # the write races with both adds
    found.clear()
    _add(checker, "c", rng)
    _add(checker, "d", rng)
    assert any(f.accesses[1].operation == "DMA write" for f in found), found


def test_random_schedules_clean(check):
    x = np.arange(40 * D, dtype=np.float32).reshape(40, D)

    def run(x):
        idx = (np.arange(4 * _lanes(), dtype=np.int32) * 5) % 40
        idx[1::4] = -1
        return _gather_fn(4, ignored=-1)(x, jnp.asarray(idx))

    _clean(check(run, x, config=_config(DmaMode.RANDOM, schedules=5)))


def test_gather_into_hbm_does_not_lower(check):
    """A gather whose destination is HBM is Mosaic's error (a compile-error finding at
    the DMA's line, the call skipped), not something to simulate."""
    def run():
        lanes = _lanes()

        @pl.kernel(out_type=jax.ShapeDtypeStruct((lanes, D), jnp.float32), mesh=_mesh(1),
                   scratch_types=[pltpu.VMEM((lanes,), jnp.int32), pltpu.SemaphoreType.DMA])
        def kernel(x_hbm, idx_hbm, o_hbm, idx_v, sem):
            pltpu.sync_copy(idx_hbm, idx_v)
            pltpu.async_copy(x_hbm.at[idx_v], o_hbm, sem).wait()

        x = jnp.zeros((16, D), jnp.float32)
        return jax.jit(kernel)(x, jnp.arange(lanes, dtype=jnp.int32))

    r = check(run, config=_config())
    kinds = [f.kind for f in r.findings]
    assert kinds == [FindingKind.COMPILE_ERROR], [f.message for f in r.findings]
    assert "from HBM to HBM" in r.findings[0].message


@pytest.mark.parametrize("mode", MODES)
def test_gather_add_by_an_index_value(check, mode):
    """`add=True` on a gather adds the rows into the VMEM destination; the index vector
    may be a value (a loaded vector) instead of a ref."""
    x = np.arange(16 * D, dtype=np.float32).reshape(16, D)

    def run(x):
        lanes = _lanes()
        idx = (np.arange(lanes, dtype=np.int32) * 5) % 16

        @pl.kernel(out_type=jax.ShapeDtypeStruct((lanes, D), jnp.float32), mesh=_mesh(1),
                   scratch_types=[pltpu.VMEM((lanes,), jnp.int32),
                                  pltpu.VMEM((lanes, D), jnp.float32),
                                  pltpu.SemaphoreType.DMA])
        def kernel(x_hbm, idx_hbm, o_hbm, idx_v, rows_v, sem):
            pltpu.sync_copy(idx_hbm, idx_v)
            rows_v[...] = jnp.ones((lanes, D), jnp.float32)
            pltpu.async_copy(x_hbm.at[idx_v[...]], rows_v, sem, add=True).wait()
            pltpu.sync_copy(rows_v, o_hbm)

        return jax.jit(kernel)(x, jnp.asarray(idx)), idx

    r = check(run, x, config=_config(mode))
    _clean(r)
    out, idx = r.value
    np.testing.assert_array_equal(np.asarray(out), x[idx] + 1.0)


def test_out_of_bounds_index_in_a_slice_of_the_index_ref(check):
    """The finding names the slice of the index ref the DMA used and the element in it."""
    x = np.arange(16 * D, dtype=np.float32).reshape(16, D)

    def run(x):
        lanes = _lanes()
        idx = np.arange(2 * lanes, dtype=np.int32) % 16
        idx[lanes + 1] = -2

        @pl.kernel(out_type=jax.ShapeDtypeStruct((lanes, D), jnp.float32), mesh=_mesh(1),
                   scratch_types=[pltpu.VMEM((2 * lanes,), jnp.int32),
                                  pltpu.VMEM((lanes, D), jnp.float32),
                                  pltpu.SemaphoreType.DMA])
        def kernel(x_hbm, idx_hbm, o_hbm, idx_v, rows_v, sem):
            pltpu.sync_copy(idx_hbm, idx_v)
            rows_v[...] = jnp.zeros((lanes, D), jnp.float32)
            pltpu.async_copy(x_hbm.at[idx_v.at[pl.ds(lanes, lanes)]], rows_v, sem).wait()
            pltpu.sync_copy(rows_v, o_hbm)

        return jax.jit(kernel)(x, jnp.asarray(idx)), lanes

    r = check(run, x, config=_config())
    oob = [f for f in r.findings if f.kind is FindingKind.OUT_OF_BOUNDS]
    assert len(oob) == 1, [f.message for f in r.findings]
    lanes = r.value[1]
    assert f"index -2 (element 1 of index vector idx_v[{lanes}:{2 * lanes}])" in \
        oob[0].message, oob[0].message
    assert format_range(oob[0].index_range) == "[-2, 0:128]"


def test_scatter_add_into_hbm_does_not_lower(check):
    """Mosaic's SparseCore scatter-add goes from VMEM into VMEM_SHARED only: `add=True`
    into an HBM ref indexed by a vector is a compile-error finding at the DMA (libtpu
    refuses it), and the call is skipped."""
    def run():
        lanes = _lanes()

        @pl.kernel(out_type=jax.ShapeDtypeStruct((lanes, D), jnp.float32), mesh=_mesh(1),
                   scratch_types=[pltpu.VMEM((lanes,), jnp.int32),
                                  pltpu.VMEM((lanes, D), jnp.float32),
                                  pltpu.SemaphoreType.DMA])
        def kernel(x_hbm, idx_hbm, o_hbm, idx_v, rows_v, sem):
            pltpu.sync_copy(idx_hbm, idx_v)
            pltpu.sync_copy(x_hbm, rows_v)
            pltpu.async_copy(rows_v, o_hbm.at[idx_v], sem, add=True).wait()

        x = jnp.ones((lanes, D), jnp.float32)
        return jax.jit(kernel)(x, jnp.arange(lanes, dtype=jnp.int32))

    r = check(run, config=_config())
    assert [f.kind for f in r.findings] == [FindingKind.COMPILE_ERROR], r.findings
    (f,) = r.findings
    assert f.buffer == "o_hbm" and "add=True into HBM" in f.message, f.message
    assert f.frames[0].code.strip().startswith("pltpu.async_copy(rows_v, o_hbm.at[idx_v]")


@pytest.mark.parametrize("row", [True, False], ids=["one-row", "whole-table"])
def test_a_row_of_a_2d_index_table_is_a_1d_index_vector(check, row):
    """`x_hbm.at[idx_v.at[1]]` of a (2, L) index table gathers by one row, a 1-D vector,
    which libtpu 0.0.42 compiles (v6e, v7x): simulated, the rows it names. The whole
    table as the index (2-D) is still Mosaic's refusal."""
    used = {}

    def run(x):
        lanes = _lanes()  # (asked inside the session: the checked generation's)
        rows = lanes if row else 2 * lanes
        idx = used["idx"] = (np.arange(2 * lanes, dtype=np.int32) * 3) % 40

        @pl.kernel(out_type=jax.ShapeDtypeStruct((rows, D), jnp.float32), mesh=_mesh(1),
                   scratch_types=[pltpu.VMEM((2, lanes), jnp.int32),
                                  pltpu.VMEM((rows, D), jnp.float32)])
        def kernel(x_hbm, idx_hbm, o_hbm, idx_v, rows_v):
            pltpu.sync_copy(idx_hbm, idx_v)
            pltpu.sync_copy(x_hbm.at[idx_v.at[1] if row else idx_v], rows_v)
            pltpu.sync_copy(rows_v, o_hbm)

        return jax.jit(kernel)(x, jnp.asarray(idx.reshape(2, lanes)))

    x = jnp.arange(40 * D, dtype=jnp.float32).reshape(40, D)
    r = check(run, x, config=_config())
    if row:
        _clean(r)
        idx = used["idx"]
        np.testing.assert_array_equal(np.asarray(r.value), np.asarray(x)[idx[len(idx) // 2:]])
    else:
        assert [f.kind for f in r.findings] == [FindingKind.COMPILE_ERROR], r.findings
        assert "only 1-D index vectors" in r.findings[0].message


@pytest.mark.parametrize("dtype, sees, refused", [
    (jnp.bfloat16, None, True), (jnp.int8, None, True), (jnp.bfloat16, jnp.uint32, False),
    (jnp.int32, None, False)], ids=["bf16", "int8", "bf16-seen-as-uint32", "int32"])
def test_an_indirect_dma_moves_32_bit_elements_only(check, dtype, sees, refused):
    """libtpu 0.0.42 (v6e, v7x) refuses a gather of 8- or 16-bit elements ("only 32-bit
    elements are supported"); the same table seen through a uint32 view gathers."""

    def run(x):
        lanes = _lanes()

        @pl.kernel(out_type=jax.ShapeDtypeStruct((lanes, D), sees or dtype), mesh=_mesh(1),
                   scratch_types=[pltpu.VMEM((lanes,), jnp.int32),
                                  pltpu.VMEM((lanes, D), sees or dtype)])
        def kernel(x_hbm, idx_hbm, o_hbm, idx_v, rows_v):
            pltpu.sync_copy(idx_hbm, idx_v)
            table = x_hbm.bitcast(sees) if sees is not None else x_hbm
            pltpu.sync_copy(table.at[idx_v], rows_v)
            pltpu.sync_copy(rows_v, o_hbm)

        return jax.jit(kernel)(x, jnp.arange(lanes, dtype=jnp.int32) * 2)

    x = jnp.arange(64 * D).astype(dtype).reshape(64, D)
    r = check(run, x, config=_config())
    if refused:
        (f,) = r.findings
        assert (f.kind, f.buffer) == (FindingKind.COMPILE_ERROR, "x_hbm"), r.findings
        assert "only 32-bit elements are supported" in f.message
        assert f.frames[0].code.strip() == "pltpu.sync_copy(table.at[idx_v], rows_v)"
    else:
        _clean(r)


@pytest.mark.parametrize("columns, window, refused", [
    (128, False, False), (256, False, True), (256, True, True)],
    ids=["rows-of-128", "rows-of-256", "a-128-column-window-of-256"])
def test_rows_between_vmem_and_vmem_shared_are_128_elements_at_most(
        check, columns, window, refused):
    """libtpu 0.0.42 (v6e, v7x) moves rows of at most 128 32-bit elements between
    VMEM_SHARED and VMEM by index ("IndirectVectorStreamStartOp doesn't support transfer
    from ... Spmem to ... TileSpmem"), a column window of wider rows neither."""

    def run(x):
        lanes = _lanes()
        width = 128 if window else columns

        @pl.kernel(out_type=jax.ShapeDtypeStruct((lanes, width), jnp.float32), mesh=_mesh(1),
                   scratch_types=[pltpu.VMEM((lanes,), jnp.int32),
                                  pltpu.VMEM((lanes, width), jnp.float32),
                                  pltpu.VMEM_SHARED((64, columns), jnp.float32)])
        def kernel(x_hbm, idx_hbm, o_hbm, idx_v, rows_v, x_sh):
            pltpu.sync_copy(x_hbm, x_sh)
            pltpu.sync_copy(idx_hbm, idx_v)
            pltpu.sync_copy(x_sh.at[idx_v, pl.ds(0, 128)] if window else x_sh.at[idx_v],
                            rows_v)
            pltpu.sync_copy(rows_v, o_hbm)

        return jax.jit(kernel)(x, jnp.arange(lanes, dtype=jnp.int32) * 3)

    x = jnp.arange(64 * columns, dtype=jnp.float32).reshape(64, columns)
    r = check(run, x, config=_config())
    if refused:
        (f,) = r.findings
        assert (f.kind, f.buffer, f.memory_space) == (
            FindingKind.COMPILE_ERROR, "x_sh", "VMEM_SHARED"), r.findings
        assert f"rows of {columns} elements between VMEM and VMEM_SHARED" in f.message
    else:
        _clean(r)
        lanes = len(np.asarray(r.value))
        np.testing.assert_array_equal(np.asarray(r.value), np.asarray(x)[np.arange(lanes) * 3])
