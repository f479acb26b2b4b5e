"""A pallas_call's parameters, read once into pallas-check's own description.

JAX hands a pallas_call's lowering a dict of params: the kernel jaxpr, a `GridMapping` with
one `BlockMapping` per operand, compiler params whose shape changed across versions. This
module reads them, here and only here, into frozen dataclasses (`CallDescription`, `Block`,
`BlockDim`) that the rest of pallas-check reads by pallas-check's own names. A version
difference in how JAX spells one of them is handled below, once.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable, Mapping

import jax
import numpy as np
from jax._src.pallas import core as _pallas_core

from pallas_check.jaxbridge import keys
from pallas_check.jaxbridge.primitives import pallas_call_p
from pallas_check.jaxbridge.types import (Blocked, BoundedSlice, ClosedJaxpr, Element, Jaxpr,
                                          ShapedArray, Squeezed)

# A pallas_call's params as JAX hands them to its lowering: opaque outside this package,
# which reads them through `describe` (a JAX version may rename any key).
CallParams = Mapping[str, Any]

# What the TPU lowering asserts of compiler params of a class with no TPU lowering rule
# (jax 0.10.2 and 0.9.2: an AssertionError with no message, so its source line).
MOSAIC_FOREIGN_PARAMS = "assert isinstance(compiler_params, tpu_core.CompilerParams)"


@dataclasses.dataclass(frozen=True)
class BlockDim:
    """One dimension of a BlockSpec's block shape: `kind` is "blocked" (a block index
    counts blocks), "squeezed" (size 1, dropped in the kernel), "element" (`pl.Element`: the
    index is an element offset; `padding` its virtual padding), "bounded"
    (`pl.BoundedSlice`: the index map returns `pl.ds`) or "unknown" (`raw` is JAX's)."""

    kind: str
    size: int
    padding: tuple[int, int] = (0, 0)
    raw: Any = None


@dataclasses.dataclass(frozen=True)
class Block:
    """How one operand's blocks map onto its array (JAX's BlockMapping)."""

    dims: tuple[BlockDim, ...]
    index_map: ClosedJaxpr  # grid indices (+ scalar prefetch refs) -> block index
    index_tree: Any  # the pytree of the index map's outputs (a `pl.ds` per bounded dim)
    array_shape: tuple[int, ...]
    array_dtype: Any  # a numpy dtype (a key's structured one, keys.py), or a semaphore dtype
    kernel_aval: Any  # the block as the kernel sees it (its ref's aval, memory space)
    kernel_shape: tuple[int, ...]
    trivial_window: bool  # the block is the whole array, at block index 0
    transformed: bool  # the block has ref transforms (a bitcast, a reshape ...)
    pipeline_mode: Any  # `pl.Buffered(n)` or None
    origin: str | None  # the BlockSpec's name in JAX's messages ("args[0]", "outputs")

    @property
    def memory_space(self) -> Any:
        return getattr(self.kernel_aval, "memory_space", None)


@dataclasses.dataclass(frozen=True)
class CallDescription:
    """A pallas_call, as pallas-check reads it (see the module docstring)."""

    kernel: Jaxpr
    name: str | None
    out_avals: tuple[Any, ...]
    aliases: tuple[tuple[int, int], ...]  # (input, output) pairs
    mesh: Any  # a core_map / pl.kernel mesh, or None
    compiler_params: Any  # as given: pltpu.CompilerParams, another backend's, or None
    semantics: tuple[str, ...]  # per grid axis as given, lowercased; () when unsaid
    vmem_limit_bytes: int | None
    collective_id: int | None
    grid: tuple[Any, ...]  # an int, `dynamic_grid_dim`, or (axis name, size) per axis
    batch_axes: tuple[int, ...]  # grid axes added by vmap
    num_scalars: int  # scalar-prefetch operands
    num_inputs: int
    num_outputs: int
    num_scratch: int
    num_grid_bounds: int  # operands that bind dynamic grid dims
    scratch: tuple[Any, ...]  # the scratch operands' avals
    blocks: tuple[Block, ...]  # inputs then outputs
    custom_grid_order: bool  # the grid mapping reorders grid indices (`get_grid_indices`)
    debug: bool

    @property
    def program_axes(self) -> list[int]:
        """The grid axes a kernel's program id counts (vmap's axes excluded)."""
        batch = set(self.batch_axes)
        return [d for d in range(len(self.grid)) if d not in batch]


def _dim(dim: Any) -> BlockDim:
    if isinstance(dim, BoundedSlice):
        return BlockDim("bounded", int(dim.block_size), raw=dim)
    if isinstance(dim, Squeezed):
        return BlockDim("squeezed", 1, raw=dim)
    if isinstance(dim, Blocked):
        return BlockDim("blocked", int(dim.block_size), raw=dim)
    if isinstance(dim, Element):
        return BlockDim("element", int(dim.block_size),
                        (int(dim.padding[0]), int(dim.padding[1])), raw=dim)
    return BlockDim("unknown", 0, raw=dim)


def _block(bm: Any) -> Block:
    aval = bm.transformed_block_aval
    inner = getattr(aval, "inner_aval", aval)
    return Block(tuple(_dim(d) for d in bm.block_shape), bm.index_map_jaxpr,
                 bm.index_map_out_tree, tuple(bm.array_aval.shape),
                 keys.held_dtype(bm.array_aval.dtype), aval, tuple(inner.shape),
                 bool(bm.has_trivial_window()), bool(bm.transforms),
                 getattr(bm, "pipeline_mode", None), getattr(bm, "origin", None))


def _mosaic_dict(compiler_params: Any) -> Mapping[str, Any]:
    """Compiler params given as a dict (older JAX and some callers): its TPU entry, which
    JAX keys "mosaic_tpu" (jax >= 0.8) or "mosaic" (before). Read here once: a reader that
    knew one key would miss the other's dimension_semantics (and the megacore split)."""
    if not isinstance(compiler_params, Mapping):
        return {}
    return compiler_params.get("mosaic_tpu") or compiler_params.get("mosaic") or {}


def _semantics(compiler_params: Any) -> tuple[str, ...]:
    given = getattr(compiler_params, "dimension_semantics", None)
    if given is None:
        given = _mosaic_dict(compiler_params).get("dimension_semantics")
    return tuple(getattr(x, "name", str(x)).lower() for x in given or ())


def _vmem_limit(compiler_params: Any) -> int | None:
    limit = getattr(compiler_params, "vmem_limit_bytes", None)
    if limit is None:
        limit = _mosaic_dict(compiler_params).get("vmem_limit_bytes")
    return int(limit) if limit else None


def _describe(params: CallParams) -> CallDescription:
    gm = params["grid_mapping"]
    compiler_params = params.get("compiler_params")
    return CallDescription(
        kernel=params["jaxpr"], name=params.get("name") or None,
        out_avals=tuple(params["out_avals"]),
        aliases=tuple((int(i), int(o)) for i, o in (params.get("input_output_aliases") or ())),
        mesh=params.get("mesh"), compiler_params=compiler_params,
        semantics=_semantics(compiler_params), vmem_limit_bytes=_vmem_limit(compiler_params),
        collective_id=getattr(compiler_params, "collective_id", None),
        grid=tuple(gm.grid), batch_axes=tuple(gm.vmapped_dims),
        num_scalars=int(gm.num_index_operands), num_inputs=int(gm.num_inputs),
        num_outputs=int(gm.num_outputs), num_scratch=int(gm.num_scratch_operands),
        num_grid_bounds=int(getattr(gm, "num_dynamic_grid_bounds", 0) or 0),
        scratch=tuple(gm.scratch_avals),
        blocks=tuple(_block(bm) for bm in gm.block_mappings),
        custom_grid_order=getattr(gm, "get_grid_indices", None) is not None,
        debug=bool(params.get("debug", False)))


# Descriptions by the identity of the call's GridMapping and kernel jaxpr (kept alive in
# the entry, so the ids stay theirs): a jitted loop lowers one pallas_call once, and every
# reader of one call shares one description.
_described: dict[tuple[int, int], tuple[Any, Any, CallDescription]] = {}
_described_lock = threading.Lock()
_DESCRIBED_MAX = 512


def describe(params: CallParams) -> CallDescription:
    """The description of a pallas_call from its params (cached per call)."""
    gm, jaxpr = params["grid_mapping"], params["jaxpr"]
    key = (id(gm), id(jaxpr))
    entry = _described.get(key)
    if entry is not None and entry[0] is gm and entry[1] is jaxpr:
        return entry[2]
    found = _describe(params)
    with _described_lock:
        if len(_described) >= _DESCRIBED_MAX:
            _described.pop(next(iter(_described)))
        _described[key] = (gm, jaxpr, found)
    return found


def kernel_of(params: CallParams) -> Jaxpr:
    """The kernel jaxpr of a pallas_call (no description built)."""
    found: Jaxpr = params["jaxpr"]
    return found


def tpu_refusal(compiler_params: Any) -> str | None:
    """What the TPU lowering says of compiler params that are not `pltpu.CompilerParams`:
    None when their class has a TPU lowering of its own. jax 0.10 looks the class up in a
    per-platform registry (a ValueError for another platform's class); jax 0.9 has no
    registry and asserts the TPU class."""
    get_rule = getattr(_pallas_core, "get_lowering_rule", None)
    if get_rule is None:  # jax 0.9
        return MOSAIC_FOREIGN_PARAMS
    try:
        if get_rule(type(compiler_params), "tpu") is not None:
            return None
    except ValueError as exc:  # "Compiler params for platform gpu cannot be used for tpu"
        return str(exc)
    return MOSAIC_FOREIGN_PARAMS


def is_tpu_params(compiler_params: Any) -> bool:
    """Whether the call's compiler params are `pltpu.CompilerParams`."""
    from jax.experimental.pallas import tpu as pltpu

    return isinstance(compiler_params, pltpu.CompilerParams)


def _semaphore(dtype: Any) -> bool:
    """A semaphore array's dtype (Pallas's extended dtypes; a key's is a numpy dtype)."""
    return jax.dtypes.issubdtype(dtype, jax.dtypes.extended)


def rebound(params: CallParams) -> Callable[..., Any]:
    """The pallas_call re-bound for the TPU compiler (interpret off), returning its results
    less any semaphore array: a call that returns DMA semaphores hands them to the next
    call of the program (JAX's cross-call async copy), which is the program the chip
    compiles; compiled alone with them as the program's results, libtpu's compiler aborts
    (libtpu 0.0.42, on a v5e too), where the program that passes them on runs
    (samples/cross_call_dma_ok.py, checked on a v5e: docs/compile.md)."""
    bound = {k: v for k, v in params.items() if k != "interpret"}
    bind: Callable[..., Any] = pallas_call_p.bind  # untyped in JAX
    kept = [k for k, aval in enumerate(params["out_avals"]) if not _semaphore(aval.dtype)]
    if len(kept) == len(params["out_avals"]):
        return lambda *args: bind(*args, interpret=False, **bound)

    def without_semaphores(*args: Any) -> tuple[Any, ...]:
        results = bind(*args, interpret=False, **bound)
        return tuple(results[k] for k in kept)
    return without_semaphores


def takes_semaphores(params: CallParams) -> bool:
    """Whether an operand of the call is a semaphore array (one another call returned): no
    program the chip compiles has one as a parameter, so the call is not compiled alone."""
    if "grid_mapping" not in params:  # a SparseCore kernel's (mpmd) params
        return False
    call = describe(params)
    inputs = call.blocks[: len(call.blocks) - len(call.out_avals)]
    return any(_semaphore(block.array_dtype) for block in inputs)


def rebound_mpmd(params: CallParams) -> Callable[..., Any]:
    """A SparseCore kernel as `pl.kernel` made it: an `mpmd_map` of its one (mesh, body),
    whose TPU lowering picks the SparseCore kernel type. The params are those JAX's CPU
    fallback of mpmd_map passed on, turned back; the fallback set the mesh's
    dimension_semantics in the compiler params, which mpmd_map itself refuses."""
    from jax._src.pallas import mpmd

    compiler_params: Any = params.get("compiler_params")
    if getattr(compiler_params, "dimension_semantics", None) is not None:
        compiler_params = compiler_params.replace(dimension_semantics=None)
    bound = dict(meshes=(params["mesh"],), jaxprs=(params["jaxpr"],), external_meshes=(),
                 out_avals=tuple(params["out_avals"]),
                 input_output_aliases=mpmd.FrozenDict(
                     dict(params.get("input_output_aliases") or ())),
                 compiler_params=compiler_params, interpret=False, debug=params["debug"],
                 cost_estimate=params.get("cost_estimate"), metadata=params.get("metadata"),
                 name=params.get("name"))
    bind: Callable[..., Any] = mpmd.mpmd_map_p.bind  # untyped in JAX
    return lambda *args: bind(*args, **bound)


def output_zeros(params: CallParams) -> list[np.ndarray]:
    """Zero arrays shaped as the call's outputs."""
    return [np.zeros(a.shape, a.dtype) for a in params["out_avals"]]


__all__ = ["Block", "BlockDim", "CallDescription", "CallParams", "MOSAIC_FOREIGN_PARAMS", "ShapedArray",
           "describe", "is_tpu_params", "kernel_of", "output_zeros", "rebound",
           "rebound_mpmd", "takes_semaphores", "tpu_refusal"]
