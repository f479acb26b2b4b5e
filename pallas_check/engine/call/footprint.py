"""A call's VMEM and SMEM allocations by the kernel's own names, and what each TPU
generation has room for: the one reckoning of a kernel's on-chip memory, used by the
engine (a call that fits no chip of `--tpu` is not simulated, engine/call/capacity.py) and by
`--compile` (the largest allocations a `vmem-exceeded` finding names; the compiler names
its allocations by number, not by ref).

Pipelined blocks are counted twice when the grid has more than one step (the Pallas TPU
pipeline double-buffers them), once otherwise, and once when the block's index map is
constant over the grid (no output depends on a grid index: Mosaic fetches it once and
allocates one buffer; libtpu 0.0.42 measured: a 4 MiB block under `lambda i: (0, 0)`,
`(1, 0)`, `(i * 0, 0)`, `(i - i, 0)` or `(s[0], 0)` adds 4 MiB to the scoped VMEM, under
`(i % 2, 0)` 8 MiB) or its `pipeline_mode=pl.Buffered(n)` says n buffers; each is padded to the TPU's (8, 128) tile
(16 or 32 rows for 16- and 8-bit types). Operands left in HBM (`pl.ANY`) take no VMEM; SMEM
operands (scalar prefetch, SMEM blocks and scratch) are reckoned apart, unpadded. The
`pl.run_scoped` allocations counted are those live together at the kernel's deepest
point. The compiler's own internal scratch cannot be named here: what this reckons is a
lower bound of what the compiler needs, never more.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterator, Mapping

import numpy as np
from jax.extend.core import Jaxpr
from numpy.typing import DTypeLike

from pallas_check.jaxbridge import params as eqn_params
from pallas_check.jaxbridge.jaxprs import arg_names, value_aval
from pallas_check.jaxbridge.call import CallParams, Block, describe, kernel_of
from pallas_check.config import TpuGeneration
from pallas_check.engine.call.describe import kernel_arg_names
from pallas_check.findings.units import format_bytes as format_bytes  # noqa: F401  (re-exported: reports use findings/units.py)

MIB = 1024 * 1024

# Bytes an array of a shape and element type takes in a memory (`tiled_bytes`, ...).
Sizer = Callable[[tuple[int, ...], DTypeLike], int]
# Per TensorCore, as JAX's own table has them (jax/_src/pallas/mosaic/tpu_info.py,
# _get_tpu_info_impl: vmem_capacity_bytes, smem_capacity_bytes) and as libtpu 0.0.42
# reports them ("Used 135.00M of 128.00M vmem", "Used 1.00M of 1.00M smem").
VMEM_CAPACITY = {TpuGeneration.V5E: 128 * MIB, TpuGeneration.V5P: 64 * MIB,
                 TpuGeneration.V6E: 128 * MIB, TpuGeneration.V7X: 64 * MIB}
SMEM_CAPACITY = {generation: MIB for generation in TpuGeneration}
# Per SparseCore vector subcore (its private VMEM, "TileSPMEM"), as JAX's table has them
# (intercept/tpu_info.py, SparseCoreInfo.vmem_capacity_bytes); v5e has no SparseCore. The capacities
# of VMEM_SHARED and of a subcore's SMEM are not in JAX's table: not checked.
SPARSECORE_VMEM_CAPACITY = {TpuGeneration.V5P: 512 * 1024, TpuGeneration.V6E: 256 * 1024,
                            TpuGeneration.V7X: 512 * 1024}
# The default limit of a kernel's scoped VMEM, as libtpu 0.0.42 applies it (E1001 "limit
# 16.00M" on v5e); pltpu.CompilerParams(vmem_limit_bytes=...) sets another (JAX passes it
# to Mosaic as is, default None: jax/_src/pallas/mosaic/core.py, CompilerParams).
SCOPED_VMEM_LIMIT = {TpuGeneration.V5E: 16 * MIB, TpuGeneration.V5P: 16 * MIB,
                     TpuGeneration.V6E: 32 * MIB, TpuGeneration.V7X: 32 * MIB}


@dataclasses.dataclass(frozen=True)
class Allocation:
    """One VMEM (or SMEM) allocation of a call: whose it is and how many bytes."""

    name: str  # the kernel's parameter name, e.g. "x_ref"
    what: str  # "block", "block (double-buffered)", "scratch", "run_scoped", ...
    nbytes: int

    def describe(self) -> str:
        return f"{self.what} {self.name} {format_bytes(self.nbytes)}"


def tiled_bytes(shape: tuple[int, ...], dtype: DTypeLike) -> int:
    """Bytes of an array in VMEM, its last two dimensions padded to whole tiles."""
    itemsize = np.dtype(dtype).itemsize
    dims = [int(d) for d in shape] or [1]
    dims[-1] = -(-dims[-1] // 128) * 128
    if len(dims) >= 2:
        rows = 8 * max(1, 4 // itemsize)
        dims[-2] = -(-dims[-2] // rows) * rows
    return math.prod(dims) * itemsize


def smem_bytes(shape: tuple[int, ...], dtype: DTypeLike) -> int:
    """Bytes of an array in SMEM (32-bit words), unpadded: a lower bound."""
    return math.prod(int(d) for d in shape) * max(4, np.dtype(dtype).itemsize)


def _memory_space(aval: object) -> str:
    return str(getattr(aval, "memory_space", "")).lower()


def _in_vmem(aval: object) -> bool:
    space = _memory_space(aval)
    return not any(word in space for word in ("any", "hbm", "smem", "semaphore", "sem"))


def _in_smem(aval: object) -> bool:
    return "smem" in _memory_space(aval)


def _block_shape(block: Block) -> tuple[int, ...]:
    """The block's size per array dim (a squeezed dim, or one of no known kind, counts 1)."""
    return tuple(dim.size if dim.kind != "unknown" else 1 for dim in block.dims)


def _array_of(aval: object) -> tuple[tuple[int, ...], DTypeLike] | None:
    """(shape, dtype) of a ref's array, None for a semaphore or another non-array."""
    inner = value_aval(aval)
    if not hasattr(inner, "shape") or not hasattr(inner, "dtype"):
        return None
    try:
        np.dtype(inner.dtype)
    except TypeError:  # a semaphore type
        return None
    return tuple(int(d) for d in inner.shape), inner.dtype


def buffer_count(block: Block, steps: int, grid_rank: int) -> int:
    """How many VMEM buffers the pipeline gives a block: its `pl.Buffered(n)`, else one in
    a single-step grid or when its index map is constant over the grid, else two."""
    if steps <= 1:
        return 1
    count = getattr(block.pipeline_mode, "buffer_count", None)
    if count:
        return int(count)
    return 1 if grid_invariant(block.index_map.jaxpr, grid_rank) else 2


def grid_invariant(jaxpr: Jaxpr, grid_rank: int) -> bool:
    """Whether no output of an index map depends on its first `grid_rank` inputs (the grid
    indices). Folds what Mosaic's canonicalisation folds in the forms index maps use:
    a product with a literal 0 and a difference of a value with itself."""
    varying = {id(v) for v in jaxpr.invars[:grid_rank]}

    def depends(atom: object) -> bool:
        return not hasattr(atom, "val") and id(atom) in varying

    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "mul" and any(hasattr(a, "val") and np.all(np.asarray(a.val) == 0)
                                 for a in eqn.invars):
            continue
        if name == "sub" and len(eqn.invars) == 2 and eqn.invars[0] is eqn.invars[1]:
            continue
        if any(depends(a) for a in eqn.invars):
            varying.update(id(v) for v in eqn.outvars)
    return not any(depends(a) for a in jaxpr.outvars)


def _operand_allocations(params: CallParams, in_space: Callable[[object], bool],
                         size: Sizer) -> Iterator[Allocation]:
    """The call's blocks and scratch in one memory space (`in_space` says which)."""
    call = describe(params)
    jaxpr = call.kernel
    names = kernel_arg_names(jaxpr)
    avals = [v.aval for v in jaxpr.invars]
    steps = math.prod(int(g) if isinstance(g, (int, np.integer)) else 2 for g in call.grid)
    first = call.num_scalars
    for k, bm in enumerate(call.blocks):
        position = first + k
        if position >= len(avals) or not in_space(avals[position]):
            continue
        copies = buffer_count(bm, steps, len(call.grid))
        what = {1: "block", 2: "block (double-buffered)"}.get(copies, f"block ({copies} buffers)")
        nbytes = copies * size(_block_shape(bm), bm.array_dtype)
        yield Allocation(names[position], what, nbytes)
    for position in range(len(avals) - call.num_scratch, len(avals)):
        array = _array_of(avals[position])
        if array is not None and in_space(avals[position]):
            yield Allocation(names[position], "scratch", size(*array))


def _scoped_peak(jaxpr: Jaxpr, in_space: Callable[[object], bool],
                 size: Sizer) -> list[Allocation]:
    """The `pl.run_scoped` allocations live together at the deepest point of `jaxpr`
    (one body's own allocations plus the largest of what nests in it)."""
    best: list[Allocation] = []
    for eqn in jaxpr.eqns:
        own: list[Allocation] = []
        subs: list[Any] = []  # the jaxprs nested in the equation (any object with eqns)
        for value in eqn_params.param_values(eqn):
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    subs.append(inner)
        if eqn.primitive.name == "run_scoped" and subs:
            body = subs[0]
            # Named as the engine names them (engine/rules/control.py, _run_scoped).
            names = arg_names(body, "scoped[{}]")
            for var, name in zip(body.invars, names):
                array = _array_of(var.aval)
                if array is not None and in_space(var.aval):
                    own.append(Allocation(name, "run_scoped", size(*array)))
        nested = max((_scoped_peak(s, in_space, size) for s in subs),
                     key=lambda allocs: sum(a.nbytes for a in allocs), default=[])
        if sum(a.nbytes for a in own + nested) > sum(a.nbytes for a in best):
            best = own + nested
    return best


def allocations(params: CallParams) -> list[Allocation]:
    """The call's VMEM allocations we can name, largest first."""
    found = list(_operand_allocations(params, _in_vmem, tiled_bytes))
    found += _scoped_peak(kernel_of(params), _in_vmem, tiled_bytes)
    return sorted(found, key=lambda a: -a.nbytes)


def _in_subcore_vmem(aval: object) -> bool:
    return _memory_space(aval) == "vmem"


def _unpadded_bytes(shape: tuple[int, ...], dtype: DTypeLike) -> int:
    return math.prod(int(d) for d in shape) * np.dtype(dtype).itemsize


def sparsecore_allocations(params: CallParams) -> list[Allocation]:
    """A SparseCore kernel's allocations in ONE vector subcore's private VMEM (every
    subcore has its own copy of each), largest first. SparseCore VMEM is not laid out in
    TensorCore (8, 128) tiles: counted unpadded, a lower bound. VMEM_SHARED is not
    counted (its capacity is unknown)."""
    found = list(_operand_allocations(params, _in_subcore_vmem, _unpadded_bytes))
    found += _scoped_peak(kernel_of(params), _in_subcore_vmem, _unpadded_bytes)
    return sorted(found, key=lambda a: -a.nbytes)


def smem_allocations(params: CallParams) -> list[Allocation]:
    """The call's SMEM allocations: scalar prefetch, SMEM blocks and scratch, largest
    first."""
    call = describe(params)
    jaxpr = call.kernel
    names = kernel_arg_names(jaxpr)
    found = []
    for position in range(call.num_scalars):
        array = _array_of(jaxpr.invars[position].aval)
        if array is not None:
            found.append(Allocation(names[position], "scalar prefetch", smem_bytes(*array)))
    found += _operand_allocations(params, _in_smem, smem_bytes)
    found += _scoped_peak(jaxpr, _in_smem, smem_bytes)
    return sorted(found, key=lambda a: -a.nbytes)


def scratch_bytes(params: CallParams) -> int:
    """VMEM of the call's scratch operands."""
    return sum(a.nbytes for a in allocations(params) if a.what == "scratch")


def scoped_limit(params: CallParams, generation: TpuGeneration) -> int:
    """The call's scoped VMEM limit on `generation`: its CompilerParams' vmem_limit_bytes,
    else the compiler's default."""
    limit = vmem_limit_bytes(params)
    return limit if limit else SCOPED_VMEM_LIMIT[generation]


def vmem_limit_bytes(params: CallParams) -> int | None:
    """`pltpu.CompilerParams(vmem_limit_bytes=...)` of the call, None when not set (a dict
    of compiler params is read by the bridge under either of JAX's keys)."""
    return describe(params).vmem_limit_bytes
