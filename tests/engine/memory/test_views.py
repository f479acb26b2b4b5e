"""Reshape and bitcast ref views are tracked element by element: the written-shadow marks
exactly the buffer elements a store through a view writes, an uninitialized read names
exactly the elements never written, and accesses to disjoint parts of a view never race
(overlapping ones do, on exactly the shared elements)."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_check.config import Config
from pallas_check.engine.memory.views import flat_boxes

F32, BF16, I32 = jnp.float32, jnp.bfloat16, jnp.int32


def _line(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def _run(check, fn, *args, races=False):
    r = check(fn, *args, config=Config(races=races))
    assert r.session.engine_error is None, r.session.engine_error
    assert r.session.calls, "the pallas_call was not intercepted"
    return np.asarray(r.value), r.findings


# -- written-shadow through views ------------------------------------------------------------

def _store_through_view(x, view, halves=1):
    """x (8, 128) is stored into `halves` of a (16, 128) f32 scratch through `view`; the
    scratch is then read whole."""

    def kernel(x_ref, o_ref, s_ref):
        for half in range(halves):
            view(s_ref, half)[...] = x_ref[...] + half
        o_ref[...] = s_ref[...] + 1  # READ-WHOLE

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((16, 128), F32),
                          scratch_shapes=[pltpu.VMEM((16, 128), F32)])(x)


VIEWS = {
    "reshape": lambda s, half: s.reshape(2, 8, 128).at[half],
    "bitcast": lambda s, half: s.bitcast(I32).at[pl.ds(8 * half, 8)],
}


@pytest.mark.parametrize("name", ["reshape", "bitcast"])
def test_half_written_through_a_view_then_read_whole_is_uninitialized(check, name):
    x = jnp.arange(8 * 128, dtype=F32).reshape(8, 128)
    view = VIEWS[name]
    if name == "bitcast":
        x = x.view(I32)
    out, findings = _run(check, lambda x: _store_through_view(x, view), x)
    assert [(f.kind.value, f.buffer, f.index_range) for f in findings] == [
        ("uninitialized", "s_ref", ((8, 16), (0, 128)))]
    assert findings[0].frames[0].line == _line(_store_through_view, "# READ-WHOLE")
    assert findings[0].details["output_range"] == [[8, 16], [0, 128]]
    assert np.isnan(out[8:]).all() and not np.isnan(out[:8]).any()


def test_columns_written_through_a_view_name_exactly_the_unwritten_columns(check):
    x = jnp.arange(16 * 64, dtype=F32).reshape(16, 64)
    # The (16, 2, 64) view's half 0 is columns 0..64 of every row: 1024 elements, not a
    # row range; the other 64 columns of every row stay unwritten.
    fn = lambda x: _store_through_view(x.reshape(8, 128), lambda s, h: s.reshape(
        16, 2, 64).at[:, h].reshape(8, 128))
    out, findings = _run(check, fn, x)
    assert [(f.kind.value, f.buffer, f.index_range) for f in findings] == [
        ("uninitialized", "s_ref", ((0, 16), (64, 128)))]
    assert np.isnan(out[:, 64:]).all()
    np.testing.assert_array_equal(out[:, :64], np.asarray(x) + 1)


@pytest.mark.parametrize("name", ["reshape", "bitcast"])
def test_both_halves_written_through_a_view_is_clean(check, name):
    x = jnp.arange(8 * 128, dtype=F32).reshape(8, 128)
    if name == "bitcast":
        x = x.view(I32)
    out, findings = _run(check, lambda x: _store_through_view(x, VIEWS[name], 2), x)
    assert findings == []
    halves = [np.asarray(x), np.asarray(x) + 1]
    want = np.concatenate([h.view(np.float32) if name == "bitcast" else h for h in halves])
    np.testing.assert_array_equal(out, want + 1)


def test_partial_element_through_a_narrowing_bitcast_stays_unwritten(check):
    """Only the low bf16 half of each f32 is stored: the f32 elements are not written."""

    def kernel(x_ref, o_ref, s_ref):
        s_ref.bitcast(BF16).at[pl.ds(0, 8, stride=2)][...] = x_ref[...]
        o_ref[...] = s_ref[...]  # READ-HALVES

    def fn(x):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), F32),
                              scratch_shapes=[pltpu.VMEM((8, 128), F32)])(x)

    x = jnp.ones((8, 128), BF16)
    _, findings = _run(check, fn, x)
    assert [(f.kind.value, f.buffer, f.index_range) for f in findings] == [
        ("uninitialized", "s_ref", ((0, 8), (0, 128)))]
    assert findings[0].frames[0].line == _line(kernel, "# READ-HALVES")


def test_a_dma_into_a_view_carries_its_sources_shadow_exactly(check):
    """A half-written scratch copied by DMA into a reshape view of another: the copy's
    never-written half is never-written there too, and only it."""

    def kernel(x_ref, o_ref, a_ref, b_ref, sem):
        a_ref[pl.ds(0, 8), :] = x_ref[...]
        copy = pltpu.make_async_copy(a_ref, b_ref.reshape(2, 8, 128), sem.at[0])
        copy.start()
        copy.wait()
        o_ref[...] = b_ref[...]  # READ-COPY

    def fn(x):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((16, 128), F32),
                              scratch_shapes=[F32_16, F32_16, pltpu.SemaphoreType.DMA((1,))])(x)

    x = jnp.arange(8 * 128, dtype=F32).reshape(8, 128)
    out, findings = _run(check, fn, x)
    assert [(f.kind.value, f.buffer, f.index_range) for f in findings] == [
        ("uninitialized", "b_ref", ((8, 16), (0, 128)))]
    assert findings[0].frames[0].line == _line(kernel, "# READ-COPY")
    np.testing.assert_array_equal(out[:8], np.asarray(x))


def test_both_halves_of_elements_stored_separately_is_clean(check):
    """Each f32 gets its two bf16 halves from two stores: no store covers it whole, so it
    stays unwritten in the shadow, but no output depends on the fill: no finding."""

    def kernel(x_ref, o_ref, s_ref):
        view = s_ref.bitcast(BF16)
        view.at[pl.ds(0, 8, stride=2)][...] = x_ref[pl.ds(0, 8)]
        view.at[pl.ds(1, 8, stride=2)][...] = x_ref[pl.ds(8, 8)]
        o_ref[...] = s_ref[...]

    def fn(x):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), F32),
                              scratch_shapes=[pltpu.VMEM((8, 128), F32)])(x)

    x = (jnp.arange(16 * 128) % 97).astype(BF16).reshape(16, 128)
    out, findings = _run(check, fn, x)
    assert findings == []
    xn = np.asarray(x)
    np.testing.assert_array_equal(out, _tpu_pack_f32(np.stack([xn[:8], xn[8:]], 1).reshape(
        16, 128)))


# -- races through views --------------------------------------------------------------------

def _two_dmas(x, scratch, first, second):
    """Two DMAs in flight at once: x's halves into `first(buf)` and `second(buf)`."""
    half = x.shape[0] // 2

    def kernel(x_hbm, o_ref, buf, sem):
        one = pltpu.make_async_copy(x_hbm.at[pl.ds(0, half)], first(buf), sem.at[0])
        two = pltpu.make_async_copy(x_hbm.at[pl.ds(half, half)], second(buf), sem.at[1])
        one.start()
        two.start()  # SECOND-START
        one.wait()
        two.wait()
        o_ref[...] = buf[...]

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(scratch.shape, scratch.dtype),
                          in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                          scratch_shapes=[scratch, pltpu.SemaphoreType.DMA((2,))])(x)


F32_16 = pltpu.VMEM((16, 128), F32)
BF16_32 = pltpu.VMEM((32, 128), BF16)
DISJOINT = {
    # (x's dtype and rows, the scratch, the two views)
    "reshape": (F32, 16, F32_16, lambda b: b.reshape(2, 8, 128).at[0],
                lambda b: b.reshape(2, 8, 128).at[1]),
    "reshape-interleaved": (F32, 16, F32_16, lambda b: b.reshape(8, 2, 128).at[:, 0],
                            lambda b: b.reshape(8, 2, 128).at[:, 1]),
    "bitcast-narrow": (BF16, 32, F32_16, lambda b: b.bitcast(BF16).at[pl.ds(0, 16)],
                       lambda b: b.bitcast(BF16).at[pl.ds(16, 16)]),
    "bitcast-wide": (I32, 16, BF16_32, lambda b: b.bitcast(I32).at[pl.ds(0, 8)],
                     lambda b: b.bitcast(I32).at[pl.ds(8, 8)]),
}


@pytest.mark.parametrize("name", sorted(DISJOINT))
def test_dmas_into_disjoint_parts_of_a_view_do_not_race(check, name):
    dtype, rows, scratch, first, second = DISJOINT[name]
    x = (jnp.arange(rows * 128) % 251).astype(dtype).reshape(rows, 128)
    out, findings = _run(check, lambda x: _two_dmas(x, scratch, first, second), x, races=True)
    assert findings == []
    xn = np.asarray(x)
    if name == "reshape-interleaved":  # halves of x land in even and odd rows
        want = np.stack([xn[:8], xn[8:]], axis=1).reshape(16, 128)
    else:
        want = xn.view(np.dtype(scratch.dtype)) if name.startswith("bitcast") else xn
        if name == "bitcast-narrow":
            want = _tpu_pack_f32(xn)
        if name == "bitcast-wide":
            want = _tpu_unpack_i32(xn)
    np.testing.assert_array_equal(out.view(np.uint8), np.asarray(want).view(np.uint8))


def _tpu_pack_f32(x_bf16: np.ndarray) -> np.ndarray:
    """bf16 rows (2r, 2r+1) as one f32 row, low half first (TPU packing)."""
    bits = x_bf16.view(np.uint16).astype(np.uint32)
    return (bits[0::2] | (bits[1::2] << 16)).view(np.float32)


def _tpu_unpack_i32(x_i32: np.ndarray) -> np.ndarray:
    """Each i32 row r as bf16 rows (2r, 2r+1): low half, then high half."""
    bits = x_i32.view(np.uint32)
    out = np.empty((2 * x_i32.shape[0], x_i32.shape[1]), np.uint16)
    out[0::2], out[1::2] = bits & 0xFFFF, bits >> 16
    return out.view(jnp.bfloat16)


OVERLAPPING = {
    # the second view shares rows 4..8 of the scratch with the first
    "reshape": (F32, 16, F32_16, lambda b: b.reshape(2, 8, 128).at[0],
                lambda b: b.reshape(4, 4, 128).at[pl.ds(1, 2)], ((4, 8), (0, 128))),
    "bitcast-narrow": (BF16, 32, F32_16, lambda b: b.bitcast(BF16).at[pl.ds(0, 16)],
                       lambda b: b.bitcast(BF16).at[pl.ds(8, 16)], ((4, 8), (0, 128))),
    "bitcast-wide": (I32, 16, BF16_32, lambda b: b.bitcast(I32).at[pl.ds(0, 8)],
                     lambda b: b.bitcast(I32).at[pl.ds(6, 8)], ((12, 16), (0, 128))),
}


@pytest.mark.parametrize("name", sorted(OVERLAPPING))
def test_dmas_into_overlapping_parts_of_a_view_race_on_exactly_the_shared_rows(check, name):
    dtype, rows, scratch, first, second, shared = OVERLAPPING[name]
    x = (jnp.arange(rows * 128) % 251).astype(dtype).reshape(rows, 128)
    _, findings = _run(check, lambda x: _two_dmas(x, scratch, first, second), x, races=True)
    races = [f for f in findings if f.kind.value == "race"]
    assert [(f.buffer, f.index_range) for f in races] == [("buf", shared)]
    assert {a.operation for a in races[0].accesses} == {"DMA write"}
    lines = {a.frames[0].line for a in races[0].accesses}
    assert _line(_two_dmas, "# SECOND-START") - 1 in lines  # the first DMA's start
    assert _line(_two_dmas, "# SECOND-START") in lines


def test_dma_into_a_view_and_a_store_beside_it_do_not_race(check):
    """The view's rows 1..3 of a (32, 64) reshape are the buffer's (0, 64:128) and
    (1, 0:64): not a box. A store into (0, 0:64), inside their bounding box, is disjoint."""

    def kernel(x_hbm, o_ref, buf, sem):
        copy = pltpu.make_async_copy(x_hbm, buf.reshape(32, 64).at[pl.ds(1, 2)], sem.at[0])
        copy.start()
        buf[pl.ds(0, 1), pl.ds(0, 64)] = jnp.full((1, 64), -1.0, F32)  # STORE-BESIDE
        copy.wait()
        buf[pl.ds(1, 15), :] = jnp.zeros((15, 128), F32) + buf[pl.ds(1, 1), pl.ds(0, 1)]
        o_ref[...] = buf[pl.ds(0, 8), :]

    def fn(x):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), F32),
                              in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                              scratch_shapes=[F32_16, pltpu.SemaphoreType.DMA((1,))])(x)

    x = jnp.arange(2 * 64, dtype=F32).reshape(2, 64) + 1
    out, findings = _run(check, fn, x, races=True)
    assert findings == []
    xn = np.asarray(x)
    np.testing.assert_array_equal(out[0], np.concatenate([np.full(64, -1.0), xn[0]]))
    np.testing.assert_array_equal(out[1:], np.full((7, 128), xn[1, 0]))


# -- the decomposition itself ------------------------------------------------------------------

@pytest.mark.parametrize("shape,picked", [
    ((16, 128), (slice(8, 16), slice(None))),
    ((16, 128), (slice(None), slice(64, 128))),
    ((4, 8, 128), (slice(1, 3), slice(0, 8, 2), slice(3, 5))),
])
def test_flat_boxes_cover_exactly_the_elements(shape, picked):
    mask = np.zeros(shape, bool)
    mask[picked] = True
    boxes = flat_boxes(np.flatnonzero(mask), shape)
    covered = np.zeros(shape, int)
    for box in boxes:
        covered[tuple(slice(lo, hi) for lo, hi in box)] += 1
    np.testing.assert_array_equal(covered, mask.astype(int))  # exact and disjoint


def test_flat_boxes_of_a_run_across_rows():
    shape = (16, 128)
    elements = np.arange(100, 400)  # row 0 from column 100, rows 1..2, row 3 up to 16
    assert flat_boxes(elements, shape) == (
        ((0, 1), (100, 128)), ((1, 3), (0, 128)), ((3, 4), (0, 16)))
    assert flat_boxes(np.arange(128, 384), shape) == (((1, 3), (0, 128)),)
