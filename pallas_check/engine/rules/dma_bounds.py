"""Where a DMA's slices lie past its refs' shapes: into the tile padding of a TensorCore
kernel's array (no out-of-bounds access: engine/memory/tiling.py), or a slice no part of
its ref holds (a traced size past the dimension: the call halts there)."""

from __future__ import annotations


from pallas_check.engine.jaxpr.halts import CallHalted
from pallas_check.engine.jaxpr.mosaic_limits import sparsecore_kernel
from pallas_check.engine.memory.region import Region, in_tile_padding
from pallas_check.engine.seam import RunningCore
from pallas_check.findings.finding import SourceFrame


def tile_padded(ctx: RunningCore, region: Region) -> Region:
    """A DMA's side reaching past its ref's shape only into the tile padding of a
    TensorCore kernel's array (`emit_pipeline`'s ragged last block, rounded up to the
    tile: engine/memory/tiling.py) is no out-of-bounds access; the padding reads as
    never written and a write there is dropped. Anything past the padding, and any
    overhang in a SparseCore kernel, stays out of bounds."""
    if not region.oob or sparsecore_kernel(ctx.call.core_mesh):
        return region
    return in_tile_padding(region) or region


def unbounded(region: Region) -> bool:
    """Whether some slice of the region is larger than its dimension (or of a negative
    size): only a traced size (`pl.ds(start, n)`, n computed by the kernel) can be, and
    such a slice has no part that its ref holds. Nothing may be allocated with its size:
    a size read from never-written SMEM is the int32 maximum, 2**31 elements."""
    if region.padded:  # every slice stays inside the padded extent
        return False
    for dim, extent in zip(region.dims, region.buffer.data.shape):
        # (a range past the `__class__` test, which mypy does not narrow on)
        if dim.__class__ is not int and (dim[1] < 0 or dim[1] > extent):  # type: ignore[index]
            return True
    return False


def halt_unbounded(ctx: RunningCore, src: Region, dst: Region,
                    frames: tuple[SourceFrame, ...]) -> None:
    """A DMA of a slice no part of its ref holds: its out-of-bounds findings, and the call
    stops there (what would such a DMA have moved?); whether its size came from
    never-written memory is decided by a re-run with the other fill (engine/call/explore.py)."""
    call = ctx.call
    for region, what in ((src, "DMA source"), (dst, "DMA destination")):
        if region.oob:
            call.out_of_bounds(ctx, region, what, None)
    call.dma_unbounded(ctx, call.sync.next_id(), src, dst, frames)
    raise CallHalted()
