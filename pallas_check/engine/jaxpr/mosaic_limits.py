"""What Mosaic (the Pallas TPU lowering) refuses to lower, found before a call is simulated.

A kernel that does not lower never runs on a TPU: the defect is the kernel's, not
pallas-check's, and it is reported as a `compile-error` finding at the user's line, the
call skipped (engine/call/explore.py), the run going on — with or without `--compile`. The
construct found here is a ref indexed by an array of indices, a gather or scatter
(`x_ref[idx_ref[...], :]`): JAX's interpreters evaluate it, Mosaic does not lower it. So
are the explicit MXU operations before TPU v7, and their shapes, types, MXUs, registers
and accumulator addresses the v7x compiler refuses (engine/jaxpr/mxu_limits.py).

In a SparseCore kernel an indirect DMA (`pltpu.async_copy(x.at[idx_ref], dst, sem)`, its
scatter form, `plsc.Indices`) is legal where Mosaic's SparseCore lowering takes it
(`sc_lowering._prepare_dma_refs`): a gather from HBM or VMEM_SHARED into VMEM indexing only
the source, a scatter from VMEM into HBM or VMEM_SHARED indexing only the destination, a
1-D index vector (a VMEM ref or a value), the indexer the last transform, no device id;
`add=True` only on such a DMA; 32-bit elements, and rows of at most 128 of them between VMEM
and VMEM_SHARED (libtpu's own refusals, `_sc_stream_refusal`). Anything else is the `compile-error` here, as on TensorCores
(where every array-indexed DMA is).

The whole kernel is looked at, every branch and loop body, as the lowering does: a gather
in a branch no grid step takes fails to compile all the same. `NotLowered` is also what
the engine raises if it meets such an access at run time.

A call's `compiler_params` of another backend (Triton's or Mosaic GPU's `CompilerParams`,
e.g. a GPU kernel's `plgpu.CompilerParams(num_warps=4)` left on a TPU call) is refused by
the TPU lowering before any of the kernel is looked at (`foreign_compiler_params`): JAX's
interpreters ignore them, a TPU never runs the call.
"""

from __future__ import annotations

from typing import Callable, Iterator, Mapping, Sequence

import numpy as np
from pallas_check.jaxbridge import call as call_bridge
from pallas_check.jaxbridge import params as eqn_params
from pallas_check.jaxbridge.jaxprs import arg_names, transformed_shape
from pallas_check.jaxbridge.primitives import dma_start_p, pl_load_p, pl_swap_p, ref_get_p, ref_swap_p, run_scoped_p
from pallas_check.jaxbridge.types import (BitcastTransform, ClosedJaxpr, Indices, Jaxpr, JaxprEqn,
                                         NDIndexer, Slice, Transform, TransformedRef, Var)


from pallas_check.config import TpuGeneration
from pallas_check.engine.jaxpr.mxu_limits import MXU_PRIMITIVES, mxu_refusal
from pallas_check.engine.memory.buffer import MemorySpace, RefView
from pallas_check.engine.memory.views import mosaic_element
from pallas_check.findings.finding import SourceFrame
from pallas_check.findings.sourceinfo import user_frames


# The lowering's own words. A load or store whose indexer holds an array: a ValueError of
# `_canonicalize_transforms_to_indexer` (jax/_src/pallas/mosaic/lowering.py). A DMA of
# `ref.at[ids]`: the slice of the ref is emitted with a vector of offsets, which Mosaic's
# verifier refuses (a VerificationError, seen with jax 0.10.2 and libtpu).
MOSAIC_LOAD_STORE = "Cannot do int indexing on TPU"
MOSAIC_REF_SLICE = ("'tpu.memref_slice' op operand #1 must be variadic of 32-bit signless"
                    " integer")


class NotLowered(Exception):
    """Mosaic does not lower what the kernel does at `frames`: the kernel's defect (a
    `compile-error` finding; the call is skipped), never an error of pallas-check."""

    def __init__(self, message: str, frames: tuple[SourceFrame, ...] = (), buffer: str = "",
                 memory_space: str = "", operation: str = "", mosaic: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.frames = frames
        self.buffer = buffer
        self.memory_space = memory_space
        self.operation = operation
        self.mosaic = mosaic  # the lowering's own error message


# Where the TPU lowering refuses another backend's compiler params: the bridge's
# `tpu_refusal` (its message differs across JAX versions).
MOSAIC_FOREIGN_PARAMS = call_bridge.MOSAIC_FOREIGN_PARAMS

# The kernel's name of each ref variable (its parameters', its scoped allocations').
Names = dict[Var, str]
# A ref's memory space name from its abstract value (any ref type; None for none).
SpaceOf = Callable[[object], str]
# One side of a DMA: its ref, the ref's transforms, its indirect indexer and the place of
# that among the transforms (None: a plain side), the operation's name, its memory space.
_Side = tuple[object, list[Transform], "tuple[NDIndexer, int] | None", str, str]


def foreign_compiler_params(params: Mapping[str, object], frames: tuple[SourceFrame, ...] = ()
                            ) -> NotLowered | None:
    """The call's `compiler_params`, when they are not the TPU's (`pltpu.CompilerParams`,
    or a class with a TPU lowering rule of its own): refused by the TPU lowering, at
    `frames` (the line that made the pallas_call, where they are written)."""
    given = call_bridge.describe(params).compiler_params
    if given is None or call_bridge.is_tpu_params(given):
        return None
    mosaic = call_bridge.tpu_refusal(given)
    if mosaic is None:
        return None  # a TPU lowering of its own
    module = type(given).__module__
    backend = ("Triton's" if "triton" in module else
               "Mosaic GPU's" if "mosaic_gpu" in module else module)
    return NotLowered(
        f"compiler_params are {backend} {type(given).__name__} on a TPU pallas_call: the"
        f" TPU lowering takes only pltpu.CompilerParams (\"{mosaic}\"); JAX's interpreters"
        f" ignore them, a TPU never runs the call: pass pltpu.CompilerParams(...)"
        f" (dimension_semantics, vmem_limit_bytes, ...) instead",
        frames, operation="compiler_params", mosaic=mosaic)


def gather_or_scatter(buffer: str, memory_space: str, operation: str,
                      frames: tuple[SourceFrame, ...]) -> NotLowered:
    """A load, store or DMA (`operation`) indexing `buffer` with an array of indices."""
    what = "gather" if operation in ("load", "DMA source") else "scatter"
    mosaic = MOSAIC_LOAD_STORE if operation in ("load", "store") else MOSAIC_REF_SLICE
    space = f" ({memory_space})" if memory_space else ""
    return NotLowered(
        f"{operation} of {buffer or 'a ref'}{space} indexed by an array of indices (a {what})"
        f" does not lower on TPU: Mosaic takes only scalar and slice indices into a ref"
        f" (\"{mosaic}\"); use a loop of scalar-indexed rows or a DMA per row",
        frames, buffer, memory_space, operation, mosaic)


def _array_indexed(transforms: object) -> bool:
    """Whether a ref's transforms index it with an array (a non-scalar integer index)."""
    for transform in transforms if isinstance(transforms, (tuple, list)) else ():
        if not isinstance(transform, NDIndexer):
            continue
        for idx in transform.indices:
            if isinstance(idx, Slice):
                continue
            if isinstance(idx, Indices):
                return True
            aval = getattr(idx, "aval", idx)
            if getattr(aval, "shape", ()):
                return True
    return False


def is_indirect_index(idx: object) -> bool:
    """Whether an indexer's first index makes a DMA indirect (a SparseCore gather or
    scatter): `plsc.Indices`, a ref (or a view of one) of indices, or an array of them (at
    trace time: a var whose value has a shape)."""
    if isinstance(idx, Indices):
        return True
    if isinstance(idx, (Slice, int)):
        return False
    if isinstance(idx, (RefView, TransformedRef)):
        return True
    aval = getattr(idx, "aval", idx)
    return bool(getattr(aval, "shape", ()))


def indirect_indexer(transforms: Sequence[object]) -> tuple[NDIndexer, int] | None:
    """The indirect indexer among a ref's transforms (outermost first) and its position,
    or None for a plain ref."""
    for at, transform in enumerate(transforms):
        if isinstance(transform, NDIndexer) and transform.indices \
                and is_indirect_index(transform.indices[0]):
            return transform, at
    return None


def sparsecore_kernel(mesh: object) -> bool:
    """Whether a call's mesh is a SparseCore one (vector or scalar subcores)."""
    return getattr(getattr(mesh, "core_type", None), "name", "").startswith("SC_")


_SC_SOURCES = (MemorySpace.HBM, MemorySpace.VMEM_SHARED)


def _sc_space(aval: object, space_of: SpaceOf) -> str:
    """A ref's memory space in a SparseCore kernel: one with none (a `jax.new_ref` the
    kernel mutates) is in HBM there (Mosaic's `memory_space_to_tpu_memory_space`)."""
    if aval is not None and getattr(aval, "memory_space", "") is None:
        return MemorySpace.HBM
    return space_of(aval)


def _sc_dma_refusal(eqn: JaxprEqn, names: Names, space_of: SpaceOf,
                    frames: Callable[[], tuple[SourceFrame, ...]]) -> NotLowered | None:
    """What Mosaic's SparseCore lowering refuses in one DMA start (see the module
    docstring), or None."""
    src, dst, _, _, device_id = eqn_params.dma_arguments(eqn, eqn.invars)
    sides: list[_Side] = []
    for ref, operation in ((src, "DMA source"), (dst, "DMA destination")):
        ref, transforms = _unwrapped(ref)
        sides.append((ref, transforms, indirect_indexer(transforms), operation,
                      _sc_space(getattr(ref, "aval", None), space_of)))
    (_, _, src_found, _, src_space), (_, _, dst_found, _, dst_space) = sides

    def refuse(side: _Side, mosaic: str) -> NotLowered:
        ref, _, _, operation, space = side
        name = names.get(ref, "") if isinstance(ref, Var) else ""
        return NotLowered(f"{operation} of {name or 'a ref'} ({space}): {mosaic}", frames(),
                          name, space, operation, mosaic)

    if src_found is None and dst_found is None:
        if eqn_params.adds(eqn):
            return refuse(sides[1], "a DMA with add=True must index the major dimension of"
                          " its HBM or VMEM_SHARED side with an index vector (Mosaic:"
                          " \"DMAs with `add=True` must (for now) specify offsets of the"
                          " majormost dimension\")")
        return None
    side = sides[0] if src_found is not None else sides[1]
    legal = ((src_found is not None and dst_found is None and src_space in _SC_SOURCES
              and dst_space == MemorySpace.VMEM)
             or (dst_found is not None and src_found is None and src_space == MemorySpace.VMEM
                 and dst_space in _SC_SOURCES))
    if not legal:
        return refuse(side, f"a gather or scatter DMA from {src_space} to {dst_space} does"
                      " not lower: Mosaic takes a gather from HBM or VMEM_SHARED into VMEM"
                      " (the source indexed) or a scatter from VMEM into HBM or VMEM_SHARED"
                      " (the destination indexed)")
    if eqn_params.adds(eqn) and dst_found is not None and dst_space == MemorySpace.HBM:
        return refuse(side, "a scatter DMA with add=True into HBM does not lower: Mosaic's"
                      " SparseCore scatter-add goes from VMEM into VMEM_SHARED only (libtpu:"
                      " \"IndirectStreamAddStartOp doesn't support transfer from source"
                      " memory space TileSpmem to destination memory space HBM\")")
    if device_id is not None:
        return refuse(side, "a gather or scatter DMA to or from a remote device does not"
                      " lower (Mosaic: \"not supported\")")
    assert side[2] is not None  # the side whose indexer was found (above)
    indexer, at = side[2]
    if at != len(side[1]) - 1:
        return refuse(side, "the indexed ref of a gather or scatter DMA cannot have any"
                      " transforms following the indexer (Mosaic)")
    index = indexer.indices[0]
    index = index.values if isinstance(index, Indices) else index
    index, index_transforms = _unwrapped(index)
    aval = getattr(index, "aval", None)
    if len(_viewed_shape(aval, index_transforms)) != 1:
        return refuse(side, "only 1-D index vectors are supported by a gather or scatter"
                      " DMA (Mosaic)")
    if hasattr(aval, "memory_space") and space_of(aval) != MemorySpace.VMEM:
        return refuse(side, f"the indices of a gather or scatter DMA must be in VMEM, got"
                      f" {space_of(aval)} (Mosaic)")
    return _sc_stream_refusal(sides, side, refuse)


# The widest row (in 32-bit elements) an indirect DMA moves between VMEM and VMEM_SHARED:
# libtpu 0.0.42 lowers wider ones to an indirect vector stream, which it refuses there
# (v6e and v7x; a row of 128 compiles, 192 and 256 do not).
SHARED_ROW_ELEMENTS = 128


def _sc_stream_refusal(sides: list[_Side], side: _Side, refuse: Callable[[_Side, str], NotLowered]
                       ) -> NotLowered | None:
    """What libtpu refuses in a legal-looking gather or scatter (seen with libtpu 0.0.42 for
    v6e and v7x, both ways): elements other than 32 bits ("'tpu.enqueue_indirect_dma' op Not
    implemented: only 32-bit elements are supported"; see a bf16 table as uint32 pairs with
    ref.bitcast), and rows wider than SHARED_ROW_ELEMENTS between VMEM and VMEM_SHARED."""
    ref, transforms, found, _, _ = side  # found: (the indexer, its place in transforms)
    assert found is not None  # (the indexed side: `_sc_dma_refusal`)
    dtype = _viewed_dtype(ref, transforms)
    if dtype is not None and np.dtype(dtype).itemsize != 4:
        return refuse(side, f"a gather or scatter DMA of {np.dtype(dtype).name} elements does"
                      " not lower: libtpu moves 32-bit elements only (\"'tpu.enqueue_indirect"
                      "_dma' op Not implemented: only 32-bit elements are supported\"); see"
                      " the data as uint32 with ref.bitcast")
    if MemorySpace.VMEM_SHARED not in (sides[0][4], sides[1][4]):
        return None
    # The row is the indexed ref's, as seen where the indexer applies: a column window
    # taken in the same indexer still strides over whole rows (libtpu refuses it too).
    shape = _viewed_shape(getattr(ref, "aval", None), transforms[:found[1]])
    row = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    if row <= SHARED_ROW_ELEMENTS:
        return None
    return refuse(side, f"a gather or scatter DMA of rows of {row} elements between VMEM and"
                  f" VMEM_SHARED does not lower: libtpu takes rows of at most"
                  f" {SHARED_ROW_ELEMENTS} there (\"IndirectVectorStreamStartOp doesn't support"
                  " transfer\" between Spmem and TileSpmem, a column window too); keep the"
                  f" table there as blocks of {SHARED_ROW_ELEMENTS} columns, or gather from HBM")


def _dma_element_refusal(eqn: JaxprEqn, names: Names, space_of: SpaceOf,
                         frames: Callable[[], tuple[SourceFrame, ...]]) -> NotLowered | None:
    """A DMA between refs of two element types (as their views see them: a bitcast
    changes it) does not lower: Mosaic's verifier wants one ("DMA source and target
    element type mismatch", seen with jax 0.10.2 and libtpu for f32 -> int32 and
    f32 -> int8); integers are signless there, so int32 and uint32 agree. A DMA moves
    bytes and never converts them."""
    sides = []
    for ref in eqn_params.dma_arguments(eqn, eqn.invars)[:2]:
        ref, transforms = _unwrapped(ref)
        dtype = _viewed_dtype(ref, transforms)
        if dtype is None:
            return None
        sides.append((ref, dtype))
    (src, src_dtype), (dst, dst_dtype) = sides
    if mosaic_element(src_dtype) == mosaic_element(dst_dtype):
        return None
    name = names.get(dst, "") if isinstance(dst, Var) else ""
    source = names.get(src, "") if isinstance(src, Var) else ""
    space = space_of(getattr(dst, "aval", None))
    mosaic = "'tpu.enqueue_dma' op DMA source and target element type mismatch"
    return NotLowered(
        f"a DMA from {source or 'a ref'} ({np.dtype(src_dtype).name}) to {name or 'a ref'}"
        f" ({np.dtype(dst_dtype).name}) does not lower: a DMA moves bytes between refs of"
        f" one element type (\"{mosaic}\"); see one ref as the other's type with"
        f" ref.bitcast", frames(), name, space, "DMA destination", mosaic)


def _unwrapped(ref: object) -> tuple[object, list[Transform]]:
    """A ref and its transforms, outermost first (`x.at[i].bitcast(t)` -> x, [at, bitcast])."""
    transforms: list[Transform] = []
    while isinstance(ref, TransformedRef):
        transforms[:0] = ref.transforms
        ref = ref.ref
    return ref, transforms


def _viewed_dtype(ref: object, transforms: Sequence[object]) -> np.dtype | None:
    """The element type a ref is seen as through its transforms (the last bitcast's), None
    when the ref has none."""
    dtype = getattr(getattr(ref, "aval", None), "dtype", None)
    for transform in transforms:
        if isinstance(transform, BitcastTransform):
            dtype = transform.dtype
    return dtype


def _viewed_shape(aval: object, transforms: Sequence[Transform]) -> tuple[int, ...]:
    """The shape of a ref seen through its transforms (`idx_v.at[i]` of an (n, L) index
    ref is one row of L: a 1-D index vector, as Mosaic takes it; libtpu 0.0.42 compiles
    such a gather)."""
    shape = tuple(getattr(aval, "shape", ()))
    if not transforms:
        return shape
    try:
        return transformed_shape(transforms, aval)
    except Exception:  # noqa: BLE001 - a transform without a static type: the ref's own
        return shape


# The equations that index refs (a load, a store, a DMA start).
_INDEXING = frozenset((ref_get_p, ref_swap_p,
                       pl_load_p, pl_swap_p,
                       dma_start_p))


def _indexed_refs(eqn: JaxprEqn) -> Iterator[tuple[object, object, str]]:
    """(ref var, its transforms, operation) of each ref an equation loads, stores or copies
    through indexers (its pytree unflattened over the equation's own vars)."""
    primitive = eqn.primitive
    if primitive in (ref_get_p, ref_swap_p):
        tree = eqn_params.operand_tree(eqn)
        transforms = tree.unflatten(eqn.invars[len(eqn.invars) - tree.num_leaves:])
        yield eqn.invars[0], transforms, "load" if primitive is ref_get_p \
            else "store"
    elif primitive in (pl_load_p, pl_swap_p):
        ref, transforms, *_ = eqn_params.args_tree(eqn).unflatten(eqn.invars)
        yield ref, transforms, "load" if primitive is pl_load_p else "store"
    elif primitive is dma_start_p:
        src, dst, *_ = eqn_params.dma_arguments(eqn, eqn.invars)
        for ref, operation in ((src, "DMA source"), (dst, "DMA destination")):
            ref, transforms = _unwrapped(ref)
            yield ref, tuple(transforms), operation


def _sub_jaxprs(eqn: JaxprEqn, names: Names) -> Iterator[tuple[Jaxpr, Names]]:
    """Each sub-jaxpr of an equation with the names of the refs it receives: its invars are
    the equation's last ones (cond branches, jit, loop bodies); a while's condition takes
    its own consts and the carry; run_scoped's are the refs it allocates (and its constvars
the outer refs it uses)."""
    for inner, outer in eqn_params.nested_with_operands(eqn):
        if eqn.primitive is run_scoped_p:
            # Its refs, and the outer refs it closes over (`pltpu.sync_copy` is a
            # run_scoped semaphore around a DMA of them): its constvars.
            scoped = dict(zip(inner.invars, scoped_names(inner)))
            scoped.update({v: names[o] for v, o in zip(inner.constvars, eqn.invars)
                           if isinstance(o, Var) and o in names})
            yield inner, scoped
            continue
        yield inner, {v: names[o] for v, o in zip(inner.invars, outer)
                      if isinstance(o, Var) and o in names}


def scoped_names(jaxpr: Jaxpr) -> list[str]:
    """The names of the refs a run_scoped body allocates, as the engine names them."""
    return arg_names(jaxpr, "scoped[{}]")


def first_not_lowered(jaxpr: Jaxpr, names: Names, space_of: SpaceOf,
                      outer: tuple[JaxprEqn, ...] = (), sparsecore: bool = False,
                      tpu: TpuGeneration | None = None) -> NotLowered | None:
    """The first access in `jaxpr` (nested ones included, in program order) that Mosaic
    does not lower, as the error to raise; None when there is none. `names`: ref var ->
    the kernel's name for it; `space_of(aval)`: a ref's memory space name; `outer`: the
    equations holding this jaxpr, innermost last (where a nested equation's line is, when
    Pallas clipped its own); `sparsecore`: a SparseCore kernel (its DMAs may gather and
    scatter); `tpu`: the generation compiled for, whose compiler's refusals of explicit
    MXU operations count (engine/jaxpr/mxu_limits.py; None: not looked at)."""
    for eqn in jaxpr.eqns:
        if tpu is not None and eqn.primitive in MXU_PRIMITIVES:
            refused = mxu_refusal(eqn, tpu)
            if refused is not None:
                return NotLowered(refused[0], _frames((*outer, eqn)),
                                  operation=eqn.primitive.name, mosaic=refused[1])
            continue
        if eqn.primitive is dma_start_p:
            found = _dma_element_refusal(eqn, names, space_of,
                                         lambda: _frames((*outer, eqn)))
            if found is not None:
                return found
        if sparsecore and eqn.primitive is dma_start_p:
            found = _sc_dma_refusal(eqn, names, space_of, lambda: _frames((*outer, eqn)))
            if found is not None:
                return found
            continue
        if eqn.primitive in _INDEXING:
            for ref, transforms, operation in _indexed_refs(eqn):
                if _array_indexed(transforms):
                    name = names.get(ref, "") if isinstance(ref, Var) else ""
                    return gather_or_scatter(name, space_of(getattr(ref, "aval", None)),
                                             operation, _frames((*outer, eqn)))
            continue
        if not eqn_params.has_params(eqn):
            continue
        for inner, inner_names in _sub_jaxprs(eqn, names):
            found = first_not_lowered(inner, inner_names, space_of, (*outer, eqn),
                                      sparsecore, tpu)
            if found is not None:
                return found
    return None


def _frames(eqns: tuple[JaxprEqn, ...]) -> tuple[SourceFrame, ...]:
    """The user's frames of the innermost of `eqns` that has some (made only for the
    access found: a kernel of many equations is looked at at every eager call)."""
    for eqn in reversed(eqns):
        frames = user_frames(eqn.source_info)
        if frames:
            return frames
    return ()


def kernel_not_lowered(jaxpr: Jaxpr, arg_names: Sequence[str],
                       space_of: SpaceOf, sparsecore: bool = False,
                       tpu: TpuGeneration | None = None) -> NotLowered | None:
    """`first_not_lowered` of a kernel's jaxpr, its parameters named as the kernel names
    them (`sparsecore`: a SparseCore kernel's; `tpu`: the generation compiled for)."""
    return first_not_lowered(jaxpr, dict(zip(jaxpr.invars, arg_names)), space_of,
                             sparsecore=sparsecore, tpu=tpu)
