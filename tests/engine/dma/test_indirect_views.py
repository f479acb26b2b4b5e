"""SparseCore gathers and scatters through a bitcast or reshape view (issue 35, item 3b;
engine/dma/indirect.py `ViewRowsRegion`): Mosaic bitcasts or reshapes the memref, then
moves rows of the view. Rows move as bytes (uint32 bits through an f32 table arrive
exactly), adds happen in the view's element type, races are found where the view's rows
lie in the buffer, and `emit_pipeline`'s `pl.Indirect` block over a bitcast view keeps its
column window. Each against a numpy reference, in every DMA mode."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

from pallas_check.config import Config, DmaMode
from pallas_check.engine.dma.indirect import ViewRowsRegion
from pallas_check.engine.memory.buffer import Buffer, MemorySpace, RefView
from pallas_check.engine.memory.region import resolve
from pallas_check.findings.finding import FindingKind, format_range
from jax._src.state import types as state_types  # the oracle: JAX's ref types

D, L = 128, 8  # row width; rows per DMA (v6e's lanes)
IDX = np.array([3, 1, 7, 7, 0, 15, 2, 9], np.int32)  # row 7 twice
SCATTER_IDX = np.array([3, 1, 7, 12, 0, 15, 2, 9], np.int32)


def _config(mode=DmaMode.ON_WAIT):
    return Config(tpu="v6e", dma_mode=mode, races=True,
                  schedules=3 if mode == DmaMode.RANDOM else 1)


def _mesh():
    return plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=1, num_subcores=1)


def _bits(rows=16) -> np.ndarray:
    bits = np.random.default_rng(5).integers(0, 2**32, (rows, D), np.uint64)
    bits[0, :4] = [0x3F50F195, 0x7FC00001, 0x00000001, 0xFF800123]
    return bits.astype(np.uint32)


def _kernel(out_shape, out_dtype, body, *scratch):
    return pl.kernel(body, out_type=jax.ShapeDtypeStruct(out_shape, out_dtype), mesh=_mesh(),
                     scratch_types=[pltpu.VMEM((L,), jnp.int32), *scratch,
                                    pltpu.SemaphoreType.DMA])


def _gather_from_bitcast(x, idx):
    """uint32 rows out of an f32 HBM table through `.bitcast(jnp.uint32)`."""
    def body(x_hbm, idx_hbm, o_hbm, idx_v, rows_v, sem):
        pltpu.sync_copy(idx_hbm, idx_v)
        pltpu.async_copy(x_hbm.bitcast(jnp.uint32).at[idx_v], rows_v, sem).wait()
        pltpu.sync_copy(rows_v, o_hbm)
    return _kernel((L, D), jnp.uint32, body, pltpu.VMEM((L, D), jnp.uint32))(x, idx)


def _gather_into_bitcast(x, idx):
    """uint32 rows into the uint32 view of an f32 VMEM buffer (the plain side a view)."""
    def body(x_hbm, idx_hbm, o_hbm, idx_v, rows_v, sem):
        pltpu.sync_copy(idx_hbm, idx_v)
        pltpu.async_copy(x_hbm.at[idx_v], rows_v.bitcast(jnp.uint32), sem).wait()
        pltpu.sync_copy(rows_v, o_hbm)
    return _kernel((L, D), jnp.float32, body, pltpu.VMEM((L, D), jnp.float32))(x, idx)


def _scatter_into_bitcast(x, idx):
    """uint32 rows scattered into the uint32 view of the f32 HBM output (zeroed first)."""
    def body(x_hbm, idx_hbm, o_hbm, idx_v, rows_v, zero_v, sem):
        zero_v[...] = jnp.zeros((16, D), jnp.float32)
        pltpu.sync_copy(zero_v, o_hbm)
        pltpu.sync_copy(idx_hbm, idx_v)
        pltpu.sync_copy(x_hbm.at[pl.ds(0, L)], rows_v)
        pltpu.async_copy(rows_v, o_hbm.bitcast(jnp.uint32).at[idx_v], sem).wait()
    return _kernel((16, D), jnp.float32, body, pltpu.VMEM((L, D), jnp.uint32),
                   pltpu.VMEM((16, D), jnp.float32))(x, idx)


def _gather_from_reshape(x, idx):
    """Rows of a (2, 8, 128) HBM array seen as (16, 128)."""
    def body(x_hbm, idx_hbm, o_hbm, idx_v, rows_v, sem):
        pltpu.sync_copy(idx_hbm, idx_v)
        pltpu.async_copy(x_hbm.reshape(16, D).at[idx_v], rows_v, sem).wait()
        pltpu.sync_copy(rows_v, o_hbm)
    return _kernel((L, D), jnp.uint32, body, pltpu.VMEM((L, D), jnp.uint32))(x, idx)


def _gather_add_into_bitcast(x, idx):
    """`add=True` into the int32 view of an f32 VMEM buffer: the adds are int32 adds."""
    def body(x_hbm, idx_hbm, o_hbm, idx_v, rows_v, sem):
        pltpu.sync_copy(idx_hbm, idx_v)
        rows_v.bitcast(jnp.int32)[...] = jnp.full((L, D), 1, jnp.int32)
        pltpu.async_copy(x_hbm.at[idx_v], rows_v.bitcast(jnp.int32), sem, add=True).wait()
        pltpu.sync_copy(rows_v, o_hbm)
    return _kernel((L, D), jnp.float32, body, pltpu.VMEM((L, D), jnp.float32))(x, idx)


def _scatter_add_into_reshape(x, idx):
    """`add=True` scatter into a (2, 8, 128) VMEM_SHARED table seen as (16, 128), zeroed
    first: rows named twice add twice."""
    def body(x_hbm, idx_hbm, o_hbm, idx_v, rows_v, table_sh, sem):
        rows_v[...] = jnp.zeros((L, D), jnp.int32)
        pltpu.sync_copy(rows_v, table_sh.at[0])
        pltpu.sync_copy(rows_v, table_sh.at[1])
        pltpu.sync_copy(idx_hbm, idx_v)
        pltpu.sync_copy(x_hbm.at[pl.ds(0, L)], rows_v)
        pltpu.async_copy(rows_v, table_sh.reshape(16, D).at[idx_v], sem, add=True).wait()
        pltpu.sync_copy(table_sh.at[0], o_hbm.at[pl.ds(0, L)])
        pltpu.sync_copy(table_sh.at[1], o_hbm.at[pl.ds(L, L)])
    return _kernel((16, D), jnp.int32, body, pltpu.VMEM((L, D), jnp.int32),
                   pltpu.VMEM_SHARED((2, L, D), jnp.int32))(x, idx)


def _added(bits):
    want = np.zeros((16, D), np.int64)
    np.add.at(want, IDX, (bits[:L] % 1000).astype(np.int64))
    return want.astype(np.uint32)


def _scattered(bits):
    want = np.zeros((16, D), np.uint32)
    want[SCATTER_IDX] = bits[:L]
    return want


CASES = {
    "gather_from_bitcast": (_gather_from_bitcast, lambda b: b.view(np.float32), IDX,
                            lambda b: b[IDX]),
    "gather_into_bitcast": (_gather_into_bitcast, lambda b: b, IDX, lambda b: b[IDX]),
    "scatter_into_bitcast": (_scatter_into_bitcast, lambda b: b, SCATTER_IDX, _scattered),
    "gather_from_reshape": (_gather_from_reshape, lambda b: b.reshape(2, 8, D), IDX,
                            lambda b: b[IDX]),
    "scatter_add_into_reshape": (_scatter_add_into_reshape,
                                 lambda b: (b % 1000).view(np.int32), IDX, _added),
    "gather_add_into_bitcast": (_gather_add_into_bitcast,
                                lambda b: (b % 1000).view(np.int32), IDX,
                                lambda b: (b % 1000)[IDX] + 1),
}


@pytest.mark.parametrize("case, mode", [
    *((case, DmaMode.ON_WAIT) for case in CASES),
    *((case, mode) for case in ("gather_from_bitcast", "scatter_into_bitcast")
      for mode in (DmaMode.EAGER, DmaMode.RANDOM))], ids=str)
def test_rows_move_through_views_bit_for_bit(check, case, mode):
    fn, to_input, idx, want = CASES[case]
    bits = _bits()
    r = check(lambda x, i: jax.jit(fn)(x, i), jnp.asarray(to_input(bits)), jnp.asarray(idx),
              config=_config(mode))
    assert r.session.engine_error is None, r.session.engine_error
    assert r.findings == [], [f.message for f in r.findings]
    np.testing.assert_array_equal(np.asarray(r.value).view(np.uint32), want(bits))


def _pipeline_gather(table, idx):
    """The issue's case: `emit_pipeline` with a `pl.Indirect` row block over a bitcast
    view, one 512-column window of 3584 at a time."""
    cols, window = 3584, 512

    def body(t_hbm, idx_hbm, o_hbm, idx_v):
        pltpu.sync_copy(idx_hbm, idx_v)

        def block(t_ref, o_ref):
            o_ref[...] = t_ref[...]

        pltpu.emit_pipeline(
            block, grid=(16 // L, cols // window),
            in_specs=[pl.BlockSpec((pl.Indirect(L), window),
                                   lambda i, j: (idx_v.at[pl.ds(i * L, L)], j))],
            out_specs=[pl.BlockSpec((L, window), lambda i, j: (i, j))],
            tiling=pltpu.Tiling.SPARSE_CORE,
        )(t_hbm.bitcast(jnp.uint32), o_hbm)

    return pl.kernel(body, out_type=jax.ShapeDtypeStruct((16, cols), jnp.uint32),
                     mesh=_mesh(), scratch_types=[pltpu.VMEM((16,), jnp.int32)])(table, idx)


@pytest.mark.parametrize("mode", [DmaMode.ON_WAIT, DmaMode.RANDOM], ids=lambda m: m.value)
def test_emit_pipeline_indirect_block_over_a_bitcast_view_keeps_its_window(check, mode):
    """Before: "DMA shapes differ: [8, 3584] -> [8, 512]" (the view's column window was
    dropped)."""
    bits = np.random.default_rng(6).integers(0, 2**32, (32, 3584), np.uint64).astype(np.uint32)
    idx = np.array([5, 0, 31, 7, 7, 2, 9, 30, 1, 3, 4, 6, 8, 10, 11, 12], np.int32)
    r = check(lambda t, i: jax.jit(_pipeline_gather)(t, i), jnp.asarray(bits.view(np.float32)),
              jnp.asarray(idx), config=_config(mode))
    assert r.session.engine_error is None, r.session.engine_error
    assert r.findings == [], [f.message for f in r.findings]
    np.testing.assert_array_equal(np.asarray(r.value), bits[idx])


def _two_scatters(x, idx):
    """Two scatters through the uint32 view of the f32 output, in flight at once."""
    def body(x_hbm, idx_hbm, o_hbm, idx_v, rows_v, sems):
        pltpu.sync_copy(idx_hbm, idx_v)
        pltpu.sync_copy(x_hbm, rows_v)
        view = o_hbm.bitcast(jnp.uint32)
        first = pltpu.async_copy(rows_v.at[pl.ds(0, L // 2)], view.at[idx_v.at[pl.ds(0, 4)]],
                                 sems.at[0])
        second = pltpu.async_copy(rows_v.at[pl.ds(L // 2, L // 2)],
                                  view.at[idx_v.at[pl.ds(4, 4)]], sems.at[1])
        first.wait()
        second.wait()
    return pl.kernel(body, out_type=jax.ShapeDtypeStruct((L, D), jnp.float32), mesh=_mesh(),
                     scratch_types=[pltpu.VMEM((L,), jnp.int32),
                                    pltpu.VMEM((L, D), jnp.uint32),
                                    pltpu.SemaphoreType.DMA((2,))])(x, idx)


@pytest.mark.parametrize("overlap", [False, True])
def test_scatters_through_a_view_race_where_their_rows_meet(check, overlap):
    """Rows 0..7 in two halves: disjoint, no finding at all; row 5 in both halves (and
    row 1 in neither), one race, on the buffer's row 5 (where the view's row 5 lies)."""
    idx = np.arange(L, dtype=np.int32)
    if overlap:
        idx[1] = 5
    r = check(lambda x, i: jax.jit(_two_scatters)(x, i), jnp.asarray(_bits(L)),
              jnp.asarray(idx), config=_config())
    assert r.session.engine_error is None, r.session.engine_error
    races = [f for f in r.findings if f.kind is FindingKind.RACE]
    if not overlap:
        assert r.findings == [], [f.message for f in r.findings]
        np.testing.assert_array_equal(np.asarray(r.value).view(np.uint32), _bits(L))
        return
    assert len(races) == 1, [f.message for f in races]
    assert races[0].buffer == "o_hbm"
    assert format_range(races[0].index_range) == format_range(((5, 6), (0, D)))


def test_a_packed_views_rows_are_boxes_of_buffer_rows_and_move_as_bytes():
    """The engine object on its own: rows 3, 4, 10, 10 of the uint32 view of a (32, 128)
    bf16 table are bf16 rows 6..10 and 20..22 (one box each: consecutive rows joined, the
    row named twice once); a row written through the view lands as its two bf16 rows."""
    table = Buffer("t", MemorySpace.HBM, np.zeros((32, D), jnp.bfloat16), written=False)
    view = RefView(table, (state_types.BitcastTransform(np.dtype(np.uint32)),))
    rows = ViewRowsRegion(resolve(view), np.array([3, 4, 10, 10]))
    assert rows.out_shape == (4, D) and rows.view_dtype() == np.uint32
    assert rows.boxes() == (((6, 10), (0, D)), ((20, 22), (0, D)))
    assert rows.index_range() == ((6, 22), (0, D))
    bits = _bits(4)
    rows.write(bits, 0)
    got = table.data.view(np.uint16)
    np.testing.assert_array_equal(got[20:22], _unpack(bits[3:4]))  # the later row 10 wins
    np.testing.assert_array_equal(got[6:10], _unpack(bits[:2]))
    assert table.written[6:10].all() and table.written[20:22].all()
    assert not table.written[:6].any() and table.written.sum() == 6 * D
    np.testing.assert_array_equal(rows.read(0)[:2], bits[:2])


def _unpack(bits):
    """uint32 rows -> their bf16 rows as uint16 bits (low half first)."""
    return bits.view(np.uint16).reshape(len(bits), D, 2).transpose(0, 2, 1).reshape(-1, D)
