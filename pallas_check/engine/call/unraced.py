"""Buffers no race can involve, found before a call runs (issue 55.4), and the kernel
entry's writes of each device's private memory (the one other write the race checker
is told of that no equation makes).

A race is two unordered accesses of one element, one of them a write (an atomic add is
one). A buffer that nothing writes during the call can be in none, whoever reads it and
in whatever order: its accesses need no event, no record and no walk. A paged attention
kernel's page table and sequence lengths (scalar prefetch, a third of its accesses with
races on) and its K/V pages in HBM (read by a DMA each) are such buffers.

What may write a buffer, decided soundly before the call: the kernel's equations, read
off its jaxpr the other way round from the compiled tier (compiled/jaxpr_facts.py, which
lists what a loop may write): a kernel ref counts as read only if EVERY use of it is a
known read (a load, `ref_get` / `pl.load`; a DMA's source; a DMA wait, which names
refs only to size what it waits for) or passes it into a jaxpr of a control-flow
primitive (cond, while, scan, jit, run_scoped, custom_jvp/vjp) whose uses of it are all
reads in turn. Any other use (a store, a DMA's destination, a SparseCore primitive, a
parallel_loop, an equation we do not know) counts as a write. A
remote DMA names its destination by the local ref, so every device's copy of a ref some
DMA may write is written. Outside the equations: the BlockSpec pipeline writes back the
call's outputs (`is_output`: never left out); a DMA carried in from an earlier call lands
in an input (a call with any is left out of this entirely); on a mesh of devices, each
device's VMEM and SMEM blocks and scratch are written at its kernel entry (`kernel_entries`:
left out only where there is one device). Buffers allocated during the call (run_scoped)
are never left out.

Likewise a buffer only its core ever touches (`escaping(..., own=True)`: a VMEM or SMEM
block, scratch or scalar prefetch copy of one core whose every use is that core's load or
store: no DMA, no parallel_loop's iterations, no primitive we do not know): one actor's
accesses are ordered by program order (DMAs and other cores are the other actors:
DESIGN.md, "Memory model"), and a BlockSpec pipeline copy's event carries its HBM block
only (state.py `on_copy_moved`), never the VMEM block.

The engine then builds no event for an access of a left-out buffer (`Buffer.unraced`)
but counts it (event_data.py `AccessesLeftOut`, at the end of the run:
`accesses_checked` is unchanged). It does so only where every listener of accesses says
it reads them for races alone (`Listener.needs_unwritten_accesses`), as the race checker
does; a recorder or any other listener gets them all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Sequence

from pallas_check.engine.events import Access, KernelEntered
from pallas_check.engine.memory.buffer import MemorySpace, RefView
from pallas_check.findings.finding import SourceFrame
from pallas_check.findings.sourceinfo import code_line
from pallas_check.jaxbridge import params as eqn_params
from pallas_check.jaxbridge import primitives as prims
from pallas_check.jaxbridge.types import Jaxpr, JaxprEqn, TransformedRef, Var

if TYPE_CHECKING:  # only for annotations
    from pallas_check.engine.call.state import CallState, CoreContext


# The primitives whose nested jaxprs receive their operands as `eqn_params.nested_with_
# operands` says (run_scoped: its constvars): a ref passed in is read there or not.
_NESTING = frozenset({prims.cond_p, prims.while_p, prims.scan_p, prims.jit_p,
                      prims.closed_call_p, prims.run_scoped_p,
                      *prims.custom_call_primitives})


class _Slot:
    """A placeholder for the operand at `position` (to find where a ref sits in a tree)."""

    def __init__(self, position: int) -> None:
        self.position = position


def _slot_of(ref: Any) -> int | None:
    while isinstance(ref, TransformedRef):
        ref = ref.ref
    return ref.position if isinstance(ref, _Slot) else None


def _kept(eqn: JaxprEqn, own: bool) -> frozenset[int] | None:
    """The operand positions through which the equation writes nothing (`own` False: a
    load's ref, a DMA start's source) or through which only the running core touches
    memory (`own` True: a load's or a store's ref); None: all of them (a DMA wait names
    refs only to size what it waits for: what the DMA lands, it writes through its
    start's destination)."""
    p = eqn.primitive
    if p is prims.dma_wait_p:
        return None
    if p is prims.ref_get_p or (own and p in (prims.ref_swap_p, prims.ref_addupdate_p)):
        return frozenset({0})
    slots = [_Slot(k) for k in range(len(eqn.invars))]
    if p is prims.pl_load_p or (own and p is prims.pl_swap_p):
        ref = _slot_of(eqn_params.args_tree(eqn).unflatten(slots)[0])
    elif p is prims.dma_start_p and not own:
        ref = _slot_of(eqn_params.dma_arguments(eqn, slots)[0])  # its source
    else:
        return frozenset()
    return frozenset() if ref is None else frozenset({ref})


def _nested(eqn: JaxprEqn) -> Iterator[tuple[Jaxpr, list[tuple[Var, Any]]]]:
    """Each nested jaxpr with (its variable, the outer operand it receives) pairs."""
    if eqn.primitive is prims.run_scoped_p:
        body: Jaxpr = eqn_params.body(eqn)
        yield body, list(zip(body.constvars, eqn.invars[len(eqn.invars) - len(body.constvars):]))
        return
    for nested, operands in eqn_params.nested_with_operands(eqn):
        yield nested, list(zip(nested.invars, operands))


_cache: dict[tuple[int, bool], tuple[Jaxpr, frozenset[Var]]] = {}


def escaping(jaxpr: Jaxpr, own: bool = False) -> frozenset[Var]:
    """The variables of `jaxpr` used otherwise than as `_kept` says (see the module's
    docstring). `own` False: every ref the jaxpr may write is among them; True: every
    ref some other actor than the core running it may touch (a DMA, a parallel_loop's
    iterations) or that it may write by a primitive we do not know."""
    entry = _cache.get((id(jaxpr), own))
    if entry is not None and entry[0] is jaxpr:
        return entry[1]
    found: set[Var] = {v for v in jaxpr.outvars if isinstance(v, Var)}
    for eqn in jaxpr.eqns:
        if eqn.primitive in _NESTING:
            bound: set[int] = set()
            for nested, pairs in _nested(eqn):
                inner = escaping(nested, own)
                for var, outer in pairs:
                    bound.add(id(outer))
                    if var in inner and isinstance(outer, Var):
                        found.add(outer)
            found.update(v for v in eqn.invars if id(v) not in bound and isinstance(v, Var))
            continue
        kept = _kept(eqn, own)
        if kept is not None:
            found.update(v for k, v in enumerate(eqn.invars)
                         if k not in kept and isinstance(v, Var))
    result = frozenset(found)
    _cache[(id(jaxpr), own)] = (jaxpr, result)
    return result


def bind(state: CallState, jaxpr: Jaxpr, kernel_args: Sequence[RefView]) -> None:
    """A core's kernel arguments: the buffers of those its equations may write are
    raced, those some other actor may touch are shared (`decide`)."""
    if not state.leave_out:
        return
    if len(kernel_args) != len(jaxpr.invars):  # (not as expected: all count as both)
        state.raced_ids.update(arg.buffer.id for arg in kernel_args)
        state.shared_ids.update(arg.buffer.id for arg in kernel_args)
        return
    written, shared = escaping(jaxpr), escaping(jaxpr, own=True)
    for arg, var in zip(kernel_args, jaxpr.invars):
        if var in written:
            state.raced_ids.add(arg.buffer.id)
        if var in shared:
            state.shared_ids.add(arg.buffer.id)


_LEFT_OUT_KEYS = frozenset({"smem", "block", "scratch", "hbm"})


def decide(state: CallState) -> None:
    """Before the first actor runs: mark the call's buffers no race can involve."""
    if not state.leave_out or state.carried_dmas or state.carried_landed or state.arriving:
        return
    one_device = state.mesh.num_devices == 1  # (else: kernel entries write private memory)
    for buf in state.registry.values():
        role = buf.key[0] if buf.key else None
        if role not in _LEFT_OUT_KEYS or buf.space == MemorySpace.SEMAPHORE:
            continue
        if (not buf.is_output and buf.id not in state.raced_ids
                and (one_device or role in ("smem", "hbm"))):
            buf.unraced = True  # nothing writes it
        elif (role in ("smem", "block", "scratch") and buf.core is not None and buf.owner
              and buf.id not in state.shared_ids
              and buf.space in (MemorySpace.VMEM, MemorySpace.SMEM)):
            buf.unraced = True  # its core's own: no other actor touches it


def kernel_entries(state: CallState, contexts: list[CoreContext]) -> None:
    """Each device's VMEM and SMEM (blocks and scratch) become the kernel's when the device
    enters the kernel; before that they may hold another kernel's data. A remote DMA from
    another device that lands there with no barrier ordering the entry before the copy
    races with the entry, and is reported at the copy's line. The cores of one device
    enter together (the compiler's entry rendezvous), so a DMA between them does not."""
    kernel = state.kernel
    frames = (SourceFrame(kernel.file, kernel.line, kernel.name,
                          code_line(kernel.file, kernel.line)),) if kernel.file else ()
    state.tell(KernelEntered(
        tuple(Access(ctx.actor, buf.id, buf.name, buf.space, tuple((0, n) for n in buf.shape),
                     True, "kernel entry (its memory becomes the kernel's)", frames, None)
              for ctx in contexts for buf in ctx.private_buffers),
        tuple((ctx.actor, ctx.device_id) for ctx in contexts)))
