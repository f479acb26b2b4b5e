"""Whether a call fits the TPU it is checked for, decided before anything is allocated.

A TPU refuses a kernel whose VMEM (blocks, scratch, run_scoped allocations) exceeds the
scoped VMEM limit (the compiler's default for the generation, or the call's
`vmem_limit_bytes`) or the chip's VMEM, or whose SMEM exceeds the chip's: such a kernel
never runs. The engine holds every such buffer in host memory, so simulating it anyway
would allocate as much as the kernel asks (64 GiB of scratch is a MemoryError). A call
that fits none of the generations of `--tpu` is therefore not simulated: it is reported
(`vmem-exceeded` at the pallas_call line, needed vs available, the largest allocations by
name) and returns its outputs filled as never-written memory (aliased outputs keep their
inputs), and the run goes on. A call that fits at least one generation is simulated (its
memory is bounded by that chip's), with a finding for each generation it overflows.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from pallas_check.jaxbridge.call import CallParams, describe, kernel_of
from pallas_check.jaxbridge import params as eqn_params
from pallas_check.config import Config, TpuGeneration, parse_generations
from pallas_check.engine.call import footprint
from pallas_check.engine.call.describe import sparsecore_mesh
from pallas_check.engine.memory.buffer import fill_value
from pallas_check.engine.runtime.caches import BoundedCache
from pallas_check.findings.finding import Finding, FindingKind, KernelInfo, SourceFrame
from pallas_check.findings.sourceinfo import code_line


LARGEST = 3  # allocations a finding names
# Beyond the blocks, scratch and run_scoped allocations reckoned here, the compiler keeps
# internal scratch of its own. libtpu 0.0.42 measured: a kernel whose blocks fill v6e's
# 32 MiB limit exactly compiles when it streams elementwise ops or a reduction (33554432
# bytes used), but a matmul needs more: on v6e 1.56 MiB beyond the blocks for a
# (1792, 1024) f32 result (7 MiB), 1.32 MiB for a (1536, 1024) one (6 MiB), 22 % of the
# result each time; on v5e and v5p 0.18 MiB for a (768, 1024) one (3 MiB), 0.125 MiB for
# (640, 1024), 5-6 %. A call reckoned within this share (rounded down) of its largest
# matmul result of the limit is reported as at the limit (and still simulated). v7x is
# left out: it compiled such kernels in less than the reckoned blocks.
DOT_HEADROOM = {TpuGeneration.V5E: 0.05, TpuGeneration.V5P: 0.05, TpuGeneration.V6E: 0.2}


@dataclasses.dataclass(frozen=True)
class Overflow:
    """One memory of one generation the call does not fit."""

    generation: TpuGeneration
    space: str  # "VMEM" or "SMEM"
    needed: int
    available: int
    reason: str
    allocations: tuple[footprint.Allocation, ...]
    at_limit: bool = False  # fits the reckoning, not the compiler's headroom: still runs


def overflows(params: CallParams, generation: TpuGeneration) -> list[Overflow]:
    """What the call does not fit on `generation` (empty: it fits)."""
    if sparsecore_mesh(params) is not None:
        return _sparsecore_overflows(params, generation)
    found = []
    vmem = footprint.allocations(params)
    needed = sum(a.nbytes for a in vmem)
    capacity = footprint.VMEM_CAPACITY[generation]
    limit = footprint.scoped_limit(params, generation)
    if needed > min(limit, capacity):
        if needed > capacity:
            reason = "over the chip's VMEM"
        elif footprint.vmem_limit_bytes(params):
            reason = "over the call's vmem_limit_bytes"
        else:
            reason = ("over the default scoped VMEM limit; raise it with"
                      " pltpu.CompilerParams(vmem_limit_bytes=...)")
        available = capacity if needed > capacity else limit
        found.append(Overflow(generation, "VMEM", needed, available, reason, tuple(vmem)))
    else:
        share = DOT_HEADROOM.get(generation, 0.0)
        headroom = int(share * _largest_dot_result(kernel_of(params))) if share else 0
        if headroom and needed + headroom > min(limit, capacity):
            reason = (f"at the limit: the compiler needs headroom for its own scratch, about"
                      f" {footprint.format_bytes(headroom)} for a matmul result; smaller"
                      f" blocks or a higher vmem_limit_bytes leave it room")
            found.append(Overflow(generation, "VMEM", needed, min(limit, capacity), reason,
                                  tuple(vmem), at_limit=True))
    smem = footprint.smem_allocations(params)
    needed = sum(a.nbytes for a in smem)
    if needed > footprint.SMEM_CAPACITY[generation]:
        found.append(Overflow(generation, "SMEM", needed,
                              footprint.SMEM_CAPACITY[generation], "over the chip's SMEM",
                              tuple(smem)))
    return found


def _largest_dot_result(jaxpr: Any) -> int:
    """VMEM bytes (tiled) of the kernel's largest matmul result, nested bodies included."""
    best = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            aval = eqn.outvars[0].aval
            best = max(best, footprint.tiled_bytes(tuple(aval.shape), aval.dtype))
        for value in eqn_params.param_values(eqn):
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    best = max(best, _largest_dot_result(inner))
    return best


def _sparsecore_overflows(params: CallParams, generation: TpuGeneration) -> list[Overflow]:
    """A SparseCore kernel against one vector subcore's VMEM of `generation` (a chip without
    SparseCores is refused when the script builds the mesh, not here)."""
    capacity = footprint.SPARSECORE_VMEM_CAPACITY.get(generation)
    vmem = footprint.sparsecore_allocations(params)
    needed = sum(a.nbytes for a in vmem)
    if capacity is None or needed <= capacity:
        return []
    return [Overflow(generation, "VMEM", needed, capacity,
                     "over a SparseCore vector subcore's VMEM", tuple(vmem))]


@dataclasses.dataclass
class CapacityCheck:
    """A call checked against the chips of `--tpu`: its findings, and whether it is
    simulated."""

    findings: list[Finding]
    simulated: bool


# A jitted call passes the same params dict at every call: its footprint is reckoned once
# (about 0.5 ms on flash attention, 4 % of a small call). The entry holds the dict, so its id
# is never another's.
_RECKONED = BoundedCache(256)


def _overflows_of_call(params: CallParams, generation: TpuGeneration) -> list[Overflow]:
    held = _RECKONED.get_or_make((id(params), generation),
                                 lambda: (params, overflows(params, generation)))
    return held[1]


def check(params: CallParams, config: Config, kernel: KernelInfo, call_index: int,
          call_site: SourceFrame | None) -> CapacityCheck:
    """The call's capacity findings for every generation of `config.tpu`; simulated
    unless it fits none of them."""
    generations = parse_generations(config.tpu)
    per_generation = {g: _overflows_of_call(params, g) for g in generations}
    fitting = [g for g, found in per_generation.items()
               if all(over.at_limit for over in found)]
    simulated_on = fitting[0] if fitting else None
    frame = call_site or (SourceFrame(kernel.file, kernel.line, kernel.name,
                                      code_line(kernel.file, kernel.line))
                          if kernel.file else None)
    fill = config.uninit.value
    aliased = bool(describe(params).aliases)
    findings = [_finding(over, kernel, call_index, frame, simulated_on, fill, aliased)
                for found in per_generation.values() for over in found]
    return CapacityCheck(findings, simulated_on is not None)


def _finding(over: Overflow, kernel: KernelInfo, call_index: int,
             frame: SourceFrame | None, simulated_on: TpuGeneration | None,
             fill: str, aliased: bool) -> Finding:
    generation = over.generation.value
    largest = over.allocations[:LARGEST]
    names = ", ".join(a.describe() for a in largest) or "none of the kernel's own"
    if simulated_on is None:
        filled = "NaN" if fill == "nan" else "zeros"
        outcome = (f"not simulated: its outputs hold the --uninit fill ({filled})"
                   + (", aliased outputs keep their inputs" if aliased else ""))
    elif over.at_limit:
        outcome = "simulated"
    else:
        outcome = f"simulated (it fits {simulated_on.value})"
    message = (f"{generation}: {footprint.format_bytes(over.needed)} of {over.space} needed,"
               f" {footprint.format_bytes(over.available)} available ({over.reason});"
               f" largest allocations: {names}; {outcome}")
    # One call made again merges; the same kernel needing another amount (other shapes)
    # is another fact, with its own numbers.
    merge = f"{generation} {over.space} {over.needed}"
    details: dict[str, Any] = {
        "used_bytes": over.needed, "available_bytes": over.available,
        "at_limit": over.at_limit,
        "allocations": [dataclasses.asdict(a) for a in over.allocations]}
    return Finding(kind=FindingKind.VMEM_EXCEEDED, message=message, kernel=kernel,
                   call_index=call_index, buffer=largest[0].name if largest else "",
                   memory_space=over.space, frames=(frame,) if frame is not None else (),
                   details=details, merge=merge, generation=generation,
                   simulated=simulated_on is not None,
                   reckoned=True)  # by pallas-check, not by the compiler (--compile)


def unsimulated_outputs(params: CallParams, device_operands: Sequence[Sequence[np.ndarray]],
                        fill: str,
                        results: Sequence[np.ndarray] | None = None
                        ) -> list[list[np.ndarray]]:
    """Per device, the outputs of a call that is not simulated: filled as never-written
    memory is, an output aliased to an input holding that input (`results`, one device:
    the buffers to fill in place)."""
    call = describe(params)
    bounds = call.num_grid_bounds
    # input_output_aliases count operands after the dynamic grid bounds.
    out_to_in = {o: i for i, o in call.aliases}
    outputs = []
    for device, operands in enumerate(device_operands):
        mine = []
        for j, aval in enumerate(call.out_avals):
            value = (np.asarray(operands[bounds + out_to_in[j]]) if j in out_to_in
                     else fill_value(aval.dtype, fill))
            if (results is not None and device == 0 and len(device_operands) == 1
                    and results[j].shape == tuple(aval.shape)):
                results[j][...] = value
                mine.append(results[j])
            else:
                mine.append(np.array(np.broadcast_to(value, tuple(aval.shape)),
                                     dtype=aval.dtype))
        outputs.append(mine)
    return outputs
