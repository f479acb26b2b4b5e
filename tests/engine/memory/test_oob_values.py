"""An access whose window crosses its ref's edge: the finding names the window, and the
simulated values stay exact — a store writes every in-bounds element (and marks it
written), drops the rest; a load reads every in-bounds element, the rest the fill.
Compared element by element against numpy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_check.config import Config, DmaMode

_SMEM = pl.BlockSpec(memory_space=pltpu.SMEM)
_VMEM = pl.BlockSpec(memory_space=pltpu.VMEM)


def _oob(checked) -> list:
    return [f for f in checked.findings if f.kind.value == "out-of-bounds"]


def _line_of(fn, text: str) -> int:
    """The line of `fn`'s source that holds `text` (the finding's expected line)."""
    import inspect
    lines, first = inspect.getsourcelines(fn)
    [hit] = [first + k for k, line in enumerate(lines) if text in line]
    return hit


def _rows_kernel(s_ref, x_ref, o_ref, r_ref):
    # Every row of o is written: rows 0..11 here, rows 12..15 by the crossing store.
    o_ref[pl.ds(0, 12), :] = jnp.full((12, 128), -1.0, jnp.float32)
    i = s_ref[0]
    o_ref[pl.ds(i, 8), :] = x_ref[pl.ds(0, 8), :]  # store: rows i..i+7, past the end
    r_ref[...] = x_ref[pl.ds(i, 8), :]  # load: rows i..i+7 of x (16 rows), past the end


def test_a_store_and_a_load_crossing_the_last_row_keep_every_in_bounds_row(check):
    x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128) + 1
    call = pl.pallas_call(
        _rows_kernel, in_specs=[_SMEM, _VMEM], out_specs=(_VMEM, _VMEM),
        out_shape=(jax.ShapeDtypeStruct((16, 128), jnp.float32),
                   jax.ShapeDtypeStruct((8, 128), jnp.float32)))
    r = check(call, jnp.array([12], jnp.int32), x)
    out, read = (np.asarray(v) for v in r.value)
    xs = np.asarray(x)
    want = np.full((16, 128), -1.0, np.float32)
    want[12:16] = xs[0:4]  # rows 12..15 of o: the first 4 rows stored, every one of them
    np.testing.assert_array_equal(out, want)
    want_read = np.full((8, 128), np.nan, np.float32)  # past the end: the fill (NaN)
    want_read[0:4] = xs[12:16]
    np.testing.assert_array_equal(read, want_read)
    store, load = sorted(_oob(r), key=lambda f: f.details["operation"] != "store")
    assert len(r.findings) == 2, r.kinds()  # no unwritten row 15 of o, nothing else
    assert store.details["operation"] == "store" and store.buffer == "o_ref"
    assert store.index_range == ((12, 20), (0, 128))
    assert store.frames[0].line == _line_of(_rows_kernel, "# store: rows")
    assert load.details["operation"] == "load" and load.buffer == "x_ref"
    assert load.index_range == ((12, 20), (0, 128))
    assert load.frames[0].line == _line_of(_rows_kernel, "# load: rows")


def _cols_kernel(s_ref, x_ref, o_ref):
    o_ref[...] = jnp.zeros_like(o_ref)
    i, j = s_ref[0], s_ref[1]
    o_ref[pl.ds(i, 8), pl.ds(j, 128)] = x_ref[...]  # crosses the last row and column


@pytest.mark.parametrize("rows_at", [4, 12, -4])
def test_a_store_crossing_the_last_column_writes_every_in_bounds_element(check, rows_at):
    """Also crossing the last row (12) or the first (-4)."""
    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128) + 1
    call = pl.pallas_call(
        _cols_kernel, in_specs=[_SMEM, _VMEM], out_specs=_VMEM,
        out_shape=jax.ShapeDtypeStruct((16, 256), jnp.float32))
    r = check(call, jnp.array([rows_at, 200], jnp.int32), x)
    want = np.zeros((16, 256), np.float32)
    lo, hi = max(rows_at, 0), min(rows_at + 8, 16)
    want[lo:hi, 200:256] = np.asarray(x)[lo - rows_at:hi - rows_at, :56]
    np.testing.assert_array_equal(np.asarray(r.value), want)
    [finding] = r.findings
    assert finding.kind.value == "out-of-bounds" and finding.buffer == "o_ref"
    assert finding.index_range == ((rows_at, rows_at + 8), (200, 328))
    assert finding.frames[0].line == _line_of(_cols_kernel, "# crosses the last")


def _dma_kernel(s_ref, x_hbm, o_ref, buf, sem):
    buf[...] = jnp.zeros_like(buf)
    copy = pltpu.make_async_copy(x_hbm, buf.at[pl.ds(s_ref[0], 8)], sem)  # crosses
    copy.start()
    copy.wait()
    o_ref[...] = buf[...]


@pytest.mark.parametrize("mode", [DmaMode.ON_WAIT, DmaMode.EAGER, DmaMode.RANDOM])
def test_a_dma_crossing_the_last_row_lands_every_in_bounds_row(check, mode):
    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128) + 1
    call = pl.pallas_call(
        _dma_kernel, in_specs=[_SMEM, pl.BlockSpec(memory_space=pl.ANY)], out_specs=_VMEM,
        out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32),
        scratch_shapes=[pltpu.VMEM((16, 128), jnp.float32), pltpu.SemaphoreType.DMA(())])
    r = check(call, jnp.array([13], jnp.int32), x, config=Config(dma_mode=mode))
    want = np.zeros((16, 128), np.float32)
    want[13:16] = np.asarray(x)[0:3]
    np.testing.assert_array_equal(np.asarray(r.value), want)
    [finding] = _oob(r)
    assert finding.details["operation"] == "DMA destination"
    assert finding.index_range == ((13, 21), (0, 128))
