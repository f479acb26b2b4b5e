"""The engine's private client: host arrays lent to it (engine/runtime/backend.py)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from pallas_check.engine.runtime.backend import engine_device, lend_to_engine


def _aligned(shape: tuple[int, ...], dtype: type, offset: int = 0) -> np.ndarray:
    """An array whose data starts `offset` bytes past a 64-byte boundary."""
    itemsize = np.dtype(dtype).itemsize
    nbytes = int(np.prod(shape)) * itemsize
    raw = np.empty(nbytes + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + offset
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def test_aligned_arrays_are_lent_and_unaligned_ones_copied_with_equal_values() -> None:
    lent = _aligned((8, 128), np.float32)
    lent[...] = np.arange(1024, dtype=np.float32).reshape(8, 128)
    unaligned = _aligned((8, 128), np.float32, offset=4)
    unaligned[...] = -np.arange(1024, dtype=np.float32).reshape(8, 128)
    arrays = lend_to_engine([lent, unaligned])
    for host, put in zip([lent, unaligned], arrays):
        assert put.devices() == {engine_device()}
        assert (put.shape, put.dtype) == (host.shape, host.dtype)
        np.testing.assert_array_equal(np.asarray(put), host)
    assert arrays[0].unsafe_buffer_pointer() == lent.ctypes.data  # no copy
    assert arrays[1].unsafe_buffer_pointer() != unaligned.ctypes.data  # a copy


def test_every_dtype_and_rank_a_kernel_passes_keeps_its_values() -> None:
    hosts = [np.array(True), np.arange(6, dtype=np.int8).reshape(2, 3),
             np.linspace(0, 1, 16, dtype=np.float32).astype(ml_dtypes.bfloat16),
             np.arange(24, dtype=np.int32).reshape(2, 3, 4), np.zeros((0, 4), np.float32)]
    for host, put in zip(hosts, lend_to_engine(hosts)):
        assert (put.shape, put.dtype) == (host.shape, host.dtype)
        np.testing.assert_array_equal(np.asarray(put), host)
