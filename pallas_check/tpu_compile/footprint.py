"""A call's VMEM allocations by the kernel's own names: what a `vmem-exceeded` finding
lists as the largest ones (the compiler names its allocations by number, not by ref).

Pipelined blocks are counted twice when the grid has more than one step (the Pallas TPU
pipeline double-buffers them), once otherwise; each is padded to the TPU's (8, 128) tile
(16 or 32 rows for 16- and 8-bit types). Operands left in HBM (`pl.ANY`) and SMEM take no
VMEM and are not listed; the compiler's own internal scratch cannot be named here.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from pallas_check.engine.call import kernel_arg_names


@dataclasses.dataclass(frozen=True)
class Allocation:
    """One VMEM allocation of a call: whose it is and how many bytes."""

    name: str  # the kernel's parameter name, e.g. "x_ref"
    what: str  # "block", "block (double-buffered)" or "scratch"
    nbytes: int

    def describe(self) -> str:
        return f"{self.what} {self.name} {format_bytes(self.nbytes)}"


def format_bytes(nbytes: int) -> str:
    """Bytes as people read them: 512 B, 24.0 KiB, 23.80 MiB."""
    if nbytes < 1024:
        return f"{nbytes} B"
    if nbytes < 1024 * 1024:
        return f"{nbytes / 1024:.1f} KiB"
    return f"{nbytes / (1024 * 1024):.2f} MiB"


def tiled_bytes(shape: tuple[int, ...], dtype: Any) -> int:
    """Bytes of an array in VMEM, its last two dimensions padded to whole tiles."""
    itemsize = np.dtype(dtype).itemsize
    dims = [int(d) for d in shape] or [1]
    dims[-1] = -(-dims[-1] // 128) * 128
    if len(dims) >= 2:
        rows = 8 * max(1, 4 // itemsize)
        dims[-2] = -(-dims[-2] // rows) * rows
    return math.prod(dims) * itemsize


def _memory_space(aval: Any) -> str:
    return str(getattr(aval, "memory_space", "")).lower()


def _in_vmem(aval: Any) -> bool:
    space = _memory_space(aval)
    return not any(word in space for word in ("any", "hbm", "smem", "semaphore", "sem"))


def _block_shape(bm: Any) -> tuple[int, ...]:
    sizes = []
    for dim in bm.block_shape:
        size = getattr(dim, "block_size", dim)
        sizes.append(1 if size is None or not isinstance(size, (int, np.integer))
                     else int(size))
    return tuple(sizes)


def allocations(params: dict) -> list[Allocation]:
    """The call's VMEM allocations we can name, largest first."""
    gm = params["grid_mapping"]
    jaxpr = params["jaxpr"]
    names = kernel_arg_names(jaxpr)
    avals = [v.aval for v in jaxpr.invars]
    steps = math.prod(int(g) if isinstance(g, (int, np.integer)) else 2 for g in gm.grid)
    copies = 2 if steps > 1 else 1
    what = "block (double-buffered)" if copies == 2 else "block"
    found = []
    first = gm.num_index_operands
    for k, bm in enumerate(gm.block_mappings):
        position = first + k
        if position >= len(avals) or not _in_vmem(avals[position]):
            continue
        dtype = bm.array_aval.dtype
        found.append(Allocation(names[position], what,
                                copies * tiled_bytes(_block_shape(bm), dtype)))
    scratch_start = len(avals) - gm.num_scratch_operands
    for position in range(scratch_start, len(avals)):
        aval = avals[position]
        inner = getattr(aval, "inner_aval", aval)
        if not _in_vmem(aval) or not hasattr(inner, "shape") or not hasattr(inner, "dtype"):
            continue
        try:
            nbytes = tiled_bytes(tuple(inner.shape), inner.dtype)
        except TypeError:  # a semaphore or another non-array type
            continue
        found.append(Allocation(names[position], "scratch", nbytes))
    return sorted(found, key=lambda a: -a.nbytes)


def scratch_bytes(params: dict) -> int:
    """VMEM of the call's scratch operands (allocated beside the compiler's scoped VMEM)."""
    return sum(a.nbytes for a in allocations(params) if a.what == "scratch")
