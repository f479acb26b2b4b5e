"""Buffer.lend: a large read returns a view of the buffer's memory instead of a copy,
and a write copies the buffer first while such a view is still held (copy on write). A
value read from a ref must never change when the ref is written afterwards."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_check.config import Config, DmaMode
from pallas_check.engine.memory.buffer import Buffer, _LENDING
from pallas_check.engine.memory.buffer import Buffer
from pallas_check.engine.memory.region import Region


def _rows(buffer: Buffer, rows: int) -> Region:
    return Region(buffer, [(0, rows, 1), (0, buffer.shape[1], 1)], [], [])


def _whole(buffer: Buffer) -> Region:
    return _rows(buffer, buffer.shape[0])


def test_lending_is_on_here():
    """The holder count is calibrated on this Python; the tests below exercise lending."""
    assert _LENDING


def test_a_held_view_survives_a_write_and_then_reads_are_copies():
    buffer = Buffer.filled("acc", "VMEM", (16, 128), np.float32, "zero")
    _whole(buffer).write_base(np.full((16, 128), 1.0, np.float32))
    held = _whole(buffer).read_base(np.float32(0))
    assert not held.flags.writeable and np.shares_memory(held, buffer.data)  # lent, no copy
    _whole(buffer).write_base(np.full((16, 128), 2.0, np.float32))
    assert (held == 1.0).all() and (buffer.data == 2.0).all()
    # Its values outlived a write once: this buffer's reads are copies from now on.
    assert not np.shares_memory(_whole(buffer).read_base(np.float32(0)), buffer.data)


def test_a_view_let_go_before_the_write_costs_no_copy():
    buffer = Buffer.filled("k_scratch", "VMEM", (16, 128), np.float32, "zero")
    for value in (1.0, 2.0, 3.0):
        dropped = _whole(buffer).read_base(np.float32(0))
        assert np.shares_memory(dropped, buffer.data)  # lent at every step
        del dropped
        address = buffer.data.ctypes.data  # (holding `data` itself would count as a holder)
        _whole(buffer).write_base(np.full((16, 128), value, np.float32))
        # A copy is made while the old memory still exists: the same address means none.
        assert buffer.data.ctypes.data == address and (buffer.data == value).all()


def test_small_or_partial_reads_are_copies():
    buffer = Buffer.filled("x", "VMEM", (64, 128), np.float32, "zero")
    quarter = _rows(buffer, 16).read_base(np.float32(0))
    small = Buffer.filled("s", "VMEM", (8, 128), np.float32, "zero")  # 4 KiB: the floor
    tiny = Buffer.filled("t", "VMEM", (4, 128), np.float32, "zero")
    assert not np.shares_memory(quarter, buffer.data)
    assert np.shares_memory(_whole(small).read_base(np.float32(0)), small.data)
    assert not np.shares_memory(_whole(tiny).read_base(np.float32(0)), tiny.data)


def test_memory_taken_over_by_another_buffer_is_still_protected():
    """An output block's array is handed on (write-back) and may come back as another
    buffer's contents: a view lent by the first buffer must not see the second's writes."""
    first = Buffer.filled("o_ref", "VMEM", (16, 128), np.float32, "zero")
    _whole(first).write_base(np.full((16, 128), 5.0, np.float32))
    held = _whole(first).read_base(np.float32(0))
    second = Buffer.filled("o_ref", "VMEM", (16, 128), np.float32, "zero")
    second.adopt(first.data, True)
    _whole(second).write_base(np.full((16, 128), 6.0, np.float32))
    assert (held == 5.0).all() and (second.data == 6.0).all()


def _read_write_read_kernel(x_ref, o_ref, s_ref):
    s_ref[...] = x_ref[...]
    before = s_ref[...]  # a whole-ref read: lent
    s_ref[...] = before * 2.0  # written while `before` is still needed below
    o_ref[...] = before + s_ref[...]


@pytest.mark.parametrize("mode", [DmaMode.ON_WAIT, DmaMode.EAGER])
def test_a_value_read_from_scratch_keeps_what_it_read(check, mode):
    x = jax.random.normal(jax.random.key(1), (16, 128), jnp.float32)
    call = pl.pallas_call(_read_write_read_kernel,
                          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          scratch_shapes=[pltpu.VMEM(x.shape, jnp.float32)])
    r = check(call, x, config=Config(dma_mode=mode, races=True))
    assert r.findings == []
    np.testing.assert_allclose(np.asarray(r.value), np.asarray(x) * 3.0, rtol=1e-6)


def _accumulate_kernel(x_ref, o_ref):
    @pl.when(pl.program_id(1) == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    acc = o_ref[...]  # the revisited output block, lent
    o_ref[...] = acc + x_ref[...]
    o_ref[...] = o_ref[...] + acc * 0.0  # `acc` read again after the write: unchanged


def test_a_revisited_output_block_accumulates_right(check):
    x = jax.random.normal(jax.random.key(2), (32, 3 * 128), jnp.float32)
    call = pl.pallas_call(
        _accumulate_kernel, grid=(2, 3),
        in_specs=[pl.BlockSpec((16, 128), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((16, 128), lambda i, j: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((32, 128), jnp.float32))
    r = check(call, x, config=Config(races=True))
    assert r.findings == []
    want = np.asarray(x).reshape(32, 3, 128).sum(axis=1)
    np.testing.assert_allclose(np.asarray(r.value), want, rtol=1e-5)
