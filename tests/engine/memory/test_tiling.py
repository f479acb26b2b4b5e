"""engine/memory/tiling.py and a region reaching into tile padding (issue 35, item 12):
what an array occupies on a TensorCore as Mosaic tiles it, and a DMA slice that runs past
its shape into that padding only: no out-of-bounds, the padding reads as never written
(its values are undefined), a write there is dropped, the range it touches of the array
is cut to the array."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from pallas_check.engine.memory.buffer import Buffer, MemorySpace
from pallas_check.engine.memory.region import in_tile_padding, index_region
from pallas_check.engine.memory.tiling import padded_shape
from jax._src import core as jax_core  # the oracle: JAX's own types
from pallas_check.jaxbridge import jax_tpu_info
from pallas_check.intercept.tpu_info import simulated_tpu

HBM, VMEM = MemorySpace.HBM, MemorySpace.VMEM


@pytest.mark.parametrize("shape, dtype, space, padded", [
    ((8, 600), np.float32, HBM, (8, 640)),
    ((601, 128), np.float32, HBM, (608, 128)),
    ((60, 600), np.float32, VMEM, (64, 640)),
    ((3, 200), np.float32, HBM, (4, 256)),  # 3 rows: a tile of 4
    ((20, 600), jnp.bfloat16, HBM, (24, 640)),
    ((2, 5, 100), np.int8, HBM, (2, 8, 128)),
    ((600,), np.float32, HBM, (640,)),
    ((600,), jnp.bfloat16, HBM, (768,)),  # 128 x 2 bf16 per 32-bit word
    ((8, 600), np.float32, MemorySpace.SMEM, (8, 600)),  # no tiles there
    ((8, 600), np.float32, MemorySpace.VMEM_SHARED, (8, 600)),
    ((8, 600), np.float64, HBM, (8, 600)),
    ((), np.float32, HBM, ()),
])
def test_padded_shape(shape, dtype, space, padded):
    assert padded_shape(shape, np.dtype(dtype), space) == padded


@pytest.mark.parametrize("generation", ["v5e", "v6e", "v7x"])
@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16, np.int8])
@pytest.mark.parametrize("shape", [(8, 600), (601, 300), (3, 200), (1, 7), (2, 37, 129),
                                   (600,), (1000,)])
def test_every_tile_emit_pipeline_rounds_to_lies_inside_the_padding(shape, dtype, generation):
    """JAX's `infer_tiling` (what `emit_pipeline` rounds a ragged block up to) divides
    each padded extent: a rounded block never reaches past the padding."""
    with simulated_tpu(generation):
        tiles = jax_tpu_info.infer_tiling(jax_core.ShapedArray(shape, np.dtype(dtype)))
    for extent, n, tile in zip(padded_shape(shape, np.dtype(dtype), HBM), shape, tiles):
        assert extent >= n and extent % tile == 0, (extent, n, tile)


def _ragged(shape=(8, 600), dtype=np.float32, written=True):
    data = np.arange(int(np.prod(shape))).reshape(shape).astype(dtype)
    return Buffer("x_hbm", HBM, data, written=written)


def test_a_slice_into_the_padding_reads_fill_never_written_and_drops_writes():
    buffer = _ragged()
    region = index_region(buffer, [((0, 8, 1), (512, 128, 1))])
    assert region.oob and not region.padded  # what the bounds check sees first
    padded = in_tile_padding(region)
    assert padded is not None and padded.oob == [] and padded.padded
    assert padded.index_range() == ((0, 8), (512, 600))  # the array's part only
    values = padded.read(np.float32(-1))
    np.testing.assert_array_equal(values[:, :88], buffer.data[:, 512:])
    assert (values[:, 88:] == -1).all()
    written = padded.read_written()
    assert written[:, :88].all() and not written[:, 88:].any()
    np.testing.assert_array_equal(padded.inside(), np.broadcast_to(np.arange(128) < 88, (8, 128)))
    padded.write(np.full((8, 128), 7, np.float32), np.float32(-1))
    assert (buffer.data[:, 512:] == 7).all() and buffer.data.shape == (8, 600)


@pytest.mark.parametrize("steps", [
    [((0, 8, 1), (512, 256, 1))],  # 512..768: past the 640 of the padding
    [((0, 9, 1), (0, 128, 1))],  # row 8 of 8 rows: (8, 600) pads no rows
    [((0, 8, 1), (-8, 128, 1))],  # before the start
])
def test_a_slice_past_the_padding_stays_out_of_bounds(steps):
    assert in_tile_padding(index_region(_ragged(), steps)) is None


def test_smem_has_no_padding():
    buffer = Buffer("s", MemorySpace.SMEM, np.zeros((8, 600), np.float32), written=True)
    assert in_tile_padding(index_region(buffer, [((0, 8, 1), (512, 128, 1))])) is None
