"""What the compiled tier reads off a kernel's jaxpr without tracing it.

Facts of the jaxpr alone, in the names of its variables: which refs a loop or branch may
write and which semaphores its waits are on (what it must carry: `tracing.carried_buffers`),
which refs some access covers only in part (their buffers start with a shadow per element:
`Layout.accessed_in_part`), and which variables nothing reads (a swap's old value there is
not read). Knowing them before tracing spares a tracing pass that would learn them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

import numpy as np

from pallas_check.jaxbridge import params as eqn_params
from pallas_check.jaxbridge import primitives as prims
from pallas_check.jaxbridge.jaxprs import value_aval
from pallas_check.jaxbridge.types import DropVar, Jaxpr, JaxprEqn, Literal, TransformedRef, Var


def unread_variables(jaxpr: Jaxpr) -> frozenset[Var]:
    """The variables an equation of `jaxpr` defines that no equation and no output
    reads: a jaxpr as traced keeps them (a `ref[...] += x` in a loop body is a swap whose
    old value is a named variable nothing uses)."""
    read = {v for eqn in jaxpr.eqns for v in eqn.invars if isinstance(v, Var)}
    read.update(v for v in jaxpr.outvars if isinstance(v, Var))
    return frozenset(v for eqn in jaxpr.eqns for v in eqn.outvars
                     if not isinstance(v, DropVar) and v not in read)


def accessed_in_part(jaxpr: Jaxpr) -> frozenset[Var]:
    """The ref variables of `jaxpr` (and the refs allocated in jaxprs nested in it) that
    a load, a store or a DMA covers only in part. A scratch buffer or output block kept
    with one bool for its written-shadow would ask for a tracing pass again, per element,
    once such an access is met (`State.written_in`); these start per element."""
    found: set[Var] = set()
    for eqn in jaxpr.eqns:
        for ref, transforms in _ref_accesses(eqn):
            if isinstance(ref, Var) and _in_part(ref, transforms):
                found.add(ref)
        for nested, bound in _bindings(eqn):
            inner = accessed_in_part(nested)
            found |= inner  # (a scoped body's allocations, by their own variables)
            found.update(v for var, k in bound.items()
                         if var in inner and isinstance(v := eqn.invars[k], Var))
    return frozenset(found)


def _ref_accesses(eqn: JaxprEqn) -> list[tuple[Any, Any]]:
    """The refs an equation loads, stores or moves by DMA, each with its transforms."""
    p = eqn.primitive
    if p is prims.ref_get_p:
        return [(eqn.invars[0], eqn_params.operand_tree(eqn).unflatten(eqn.invars[1:]))]
    if p in (prims.ref_swap_p, prims.ref_addupdate_p):
        return [(eqn.invars[0], eqn_params.operand_tree(eqn).unflatten(eqn.invars[2:]))]
    if p in (prims.pl_load_p, prims.pl_swap_p):
        ref, transforms, *_ = eqn_params.args_tree(eqn).unflatten(eqn.invars)
        return [(ref, transforms)]
    if p is prims.dma_start_p:
        found = []
        for ref in eqn_params.dma_arguments(eqn, eqn.invars)[:2]:
            applied: tuple[Any, ...] = ()
            while isinstance(ref, TransformedRef):
                ref, applied = ref.ref, (*ref.transforms, *applied)
            found.append((ref, applied))
        return found
    return []


def _in_part(ref: Var, transforms: Any) -> bool:
    """Whether the transforms select less than the whole ref (statically: a slice
    shorter than its dimension, or an integer index into a dimension longer than 1)."""
    aval: Any = value_aval(ref.aval)
    view = list(aval.shape)
    for transform in transforms or ():
        indices = getattr(transform, "indices", None)
        if indices is None or len(indices) != len(view):
            return True
        kept = []
        for n, index in zip(view, indices):
            if hasattr(index, "size") and hasattr(index, "stride"):  # a Slice
                if not isinstance(index.size, (int, np.integer)) or index.size != n:
                    return True
                kept.append(n)
            elif np.ndim(getattr(index, "aval", index)) != 0 or n != 1:
                return True
        view = kept
    return False


class _Slot:
    """A placeholder for the operand at `position` (where a DMA's destination sits)."""

    def __init__(self, position: int) -> None:
        self.position = position


@dataclasses.dataclass(frozen=True)
class _Writes:
    """What a jaxpr may write, in the names of its own variables: the refs it stores to
    or starts DMAs into, whether it waits (and so may land DMAs), and the semaphore refs
    its waits are on (None: some wait is on a semaphore it allocates itself)."""

    refs: frozenset[Any]
    waits: bool
    waited: frozenset[Any] | None


_writes_cache: dict[int, tuple[Jaxpr, _Writes]] = {}


def _jaxpr_writes(jaxpr: Jaxpr) -> _Writes:
    """What a loop or branch over `jaxpr` must carry (see `_Writes`)."""
    entry = _writes_cache.get(id(jaxpr))
    if entry is not None and entry[0] is jaxpr:
        return entry[1]
    written: set[Any] = set()
    waits = False
    waited: set[Any] | None = set()
    for eqn in jaxpr.eqns:
        positions, eqn_waits, eqn_waited = eqn_writes(eqn)
        written.update(eqn.invars[k] for k in positions)
        waits = waits or eqn_waits
        if waited is not None:
            waited = None if eqn_waited is None else waited | {eqn.invars[k]
                                                               for k in eqn_waited}
    found = _Writes(frozenset(v for v in written if not isinstance(v, Literal)), waits,
                    None if waited is None else frozenset(waited))
    _writes_cache[id(jaxpr)] = (jaxpr, found)
    return found


def eqn_writes(eqn: JaxprEqn) -> tuple[set[int], bool, set[int] | None]:
    """The positions among the equation's operands of refs it may write; whether it
    may land DMAs (a wait); the positions of the semaphore refs its waits are on (None:
    a semaphore that is not an operand, one it allocates)."""
    p = eqn.primitive
    if p in (prims.ref_swap_p, prims.ref_addupdate_p):
        return {0}, False, set()
    slots = [_Slot(k) for k in range(len(eqn.invars))]
    if p is prims.pl_swap_p:
        return {_slot_of(eqn_params.args_tree(eqn).unflatten(slots)[0])}, False, set()
    if p is prims.dma_start_p:
        return {_slot_of(eqn_params.dma_arguments(eqn, slots)[1])}, False, set()
    if p is prims.dma_wait_p:
        return set(), True, {_slot_of(eqn_params.dma_arguments(eqn, slots)[2])}
    if p is prims.semaphore_wait_p:
        return set(), True, {_slot_of(eqn_params.args_tree(eqn).unflatten(slots)[0])}
    positions: set[int] = set()
    waits = False
    waited: set[int] | None = set()
    for nested, bound in _bindings(eqn):
        inner = _jaxpr_writes(nested)
        waits = waits or inner.waits
        positions.update(k for var, k in bound.items() if var in inner.refs)
        here = _outer_positions(inner.waited, bound)
        waited = None if waited is None or here is None else waited | here
    return positions, waits, waited


def _bindings(eqn: JaxprEqn) -> Iterator[tuple[Jaxpr, dict[Any, int]]]:
    """Each jaxpr nested in the equation, with the operand position that each of its
    variables naming an outer operand receives (a run_scoped body: the constvars it closes
    over; its invars are the refs it allocates)."""
    if eqn.primitive is prims.run_scoped_p:
        body: Jaxpr = eqn_params.body(eqn)
        offset = len(eqn.invars) - len(body.constvars)
        yield body, {v: offset + k for k, v in enumerate(body.constvars)}
        return
    for nested, operands in eqn_params.nested_with_operands(eqn):
        bound: dict[Any, int] = {}
        for var, atom in zip(nested.invars, operands):
            found = next((k for k, v in enumerate(eqn.invars) if v is atom), None)
            if found is not None:
                bound[var] = found
        yield nested, bound


def _outer_positions(inner: frozenset[Any] | None, outer: dict[Any, int]) -> set[int] | None:
    """The operand positions of a nested jaxpr's variables (None: one is not an operand)."""
    if inner is None or any(v not in outer for v in inner):
        return None
    return {outer[v] for v in inner}


def _slot_of(ref: Any) -> int:
    while isinstance(ref, TransformedRef):
        ref = ref.ref
    assert isinstance(ref, _Slot)
    return ref.position
