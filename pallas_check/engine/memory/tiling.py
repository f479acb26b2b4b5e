"""Tile padding: the memory an array really occupies on a TensorCore, as Mosaic tiles it.

Mosaic lays a TensorCore kernel's HBM and VMEM arrays out in tiles (its memref layout
inference; `pltpu.emit_pipeline` rounds a ragged last block with the same rule, JAX's
`tpu_info.infer_tiling`): the minor dimension of an array of rank 2 or more in tiles of
128 lanes, the second-minor in tiles of `_second_minor_tile` rows, an array of rank 1 in
tiles of 128 x packing elements (packing: elements of the dtype per 32-bit word). So an
(8, 600) f32 array occupies (8, 640): lanes 600..640 are its tile padding, part of its
allocation. A DMA of a ragged last block (`emit_pipeline` over 600 lanes in blocks of
256 copies lanes 512..640) touches that padding and nothing outside the array; on a TPU
it moves whatever the padding holds, and what it writes there no one reads.

The engine models such a DMA as the TPU runs it (engine/memory/region.py, `padded`):
no out-of-bounds finding; the padding reads as never-written memory (its value is
undefined: the second fill decides whether it reaches an output), a write there is
dropped. A DMA reaching past the padding is out of bounds as before. SparseCore kernels
and SMEM get no padding (their layouts are not these tiles): there every element past an
array's shape is out of bounds.
"""

from __future__ import annotations

import numpy as np

from pallas_check.engine.memory.buffer import MemorySpace

LANES = 128  # the minor tile (Mosaic's (8, 128) COMPACT tiling)
SUBLANES = 8  # the largest second-minor tile it infers for a kernel's arrays
_TILED = (MemorySpace.HBM, MemorySpace.VMEM)


def _packing(dtype: np.dtype) -> int:
    """Elements per 32-bit word (1 for 32-bit types, 2 for bf16, 4 for int8)."""
    return max(1, 4 // np.dtype(dtype).itemsize)


def _second_minor_tile(rows: int, packing: int) -> int:
    """The second-minor tile of an array with `rows` rows, as Mosaic infers it on the
    generations simulated (v5 and later): `packing` rows, doubled while under both
    `rows` and 8."""
    tile = packing
    while tile < min(rows, SUBLANES):
        tile *= 2
    return tile


def padded_shape(shape: tuple[int, ...], dtype: np.dtype, space: str) -> tuple[int, ...]:
    """The extent of each dimension of an array in memory, its tile padding included
    (its shape where it has none: SMEM, other spaces, 64-bit types, 0-d)."""
    dtype = np.dtype(dtype)
    if space not in _TILED or not shape or dtype.itemsize > 4:
        return tuple(shape)
    packing = _packing(dtype)
    if len(shape) == 1:
        return (_round_up(shape[0], LANES * packing),)
    *lead, rows, lanes = shape
    return (*lead, _round_up(rows, _second_minor_tile(rows, packing)), _round_up(lanes, LANES))


def _round_up(n: int, tile: int) -> int:
    return -(-n // tile) * tile
