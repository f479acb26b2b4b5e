"""A call as one computation: the grid loop, the BlockSpec pipeline, the kernel body.

`build(params, config)` traces the call (`trace`: twice when a landing was traced before a
DMA site it must cover was met) and compiles it for the engine's CPU client; the result takes
the call's operands and returns its outputs and the verdict. It also holds the traced
function itself, which intercept/patched_lowering.py lowers into the script's own program
(a call run inline, with no host callback of its own).

The pipeline, as one TPU core runs it (what the engine's `engine/call/pipeline.py`
models, on one core, with nothing racing it): grid points in row-major order; an input's
block is copied in when its block index changes (a kernel that writes its input block
keeps what it wrote while the index stays); an output's block starts never-written, is
written back when its index changes and at the end; an output block visited again after
another is REVISIT (the engine decides whether work was lost). Block copies are selected,
not branched: each step slices what it would copy and keeps the old block where the
index stayed, so XLA updates the arrays in place.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax

from pallas_check.compiled.boxes import all_set, put, take
from pallas_check.compiled.eligibility import pipelined
from pallas_check.compiled.machine import Machine
from pallas_check.compiled.refs import BufferInfo, Ref, Unsupported
from pallas_check.compiled.state import Layout
from pallas_check.compiled.jaxpr_facts import accessed_in_part
from pallas_check.compiled.tracing import Evaluator, allocate
from pallas_check.compiled.verdict import Verdict
from pallas_check.config import Config, DmaMode
from pallas_check.engine.jaxpr.program import SEGMENT_COMPILER_OPTIONS
from pallas_check.engine.memory.buffer import fill_value
from pallas_check.engine.runtime.backend import engine_device
from pallas_check.engine.runtime.disk_cache import compile_cached
from pallas_check.jaxbridge.call import Block, CallDescription, CallParams, describe
from pallas_check.jaxbridge.jaxprs import arg_names, value_aval

# What the compiled call returns: the outputs, the verdict (an int32 of Verdict bits) and
# what the race check covered (accesses checked, most DMAs in flight at once).
Compiled = Callable[..., tuple[list[jax.Array], jax.Array, jax.Array]]


@dataclasses.dataclass(frozen=True)
class Built:
    """A call structure built: its executable on the engine's CPU client, and the same
    computation as a jitted function of the call's operands, to be traced into another
    program (its DMA sites all known: tracing it again gives the same computation)."""

    executable: Compiled
    function: Compiled


@dataclasses.dataclass
class _Operand:
    """A pipelined operand: its array in HBM, its block in VMEM, and its BlockSpec."""

    hbm: int
    block: int
    spec: Block
    output: bool


# Tracing passes after the first (each learns DMA sites or per-element shadows; the
# first usually learns everything there is).
_MAX_RETRACES = 3


@dataclasses.dataclass(frozen=True)
class Traced:
    """A call structure traced, not compiled: the jitted function whose trace `traced` is
    (exported from it, the trace is reused), the operands' avals, and a factory of the
    same computation as a new function object (for the function a build keeps)."""

    jitted: Any
    traced: Any  # jax.stages.Traced
    avals: list[jax.ShapeDtypeStruct]
    function: Callable[[], Compiled]


def build(params: CallParams, config: Config) -> Built:
    """The call compiled in this process (raises `Unsupported` with the reason when it
    cannot be): what `--tier compiled` waits for; under `auto` intercept/builds.py
    compiles `trace`'s result in a worker process, under a budget."""
    found = trace(params, config)
    try:
        # Read back when another process compiled the same program (a test suite's
        # processes each meet the structure's first call).
        executable = compile_cached(found.traced.lower(), engine_device(),
                                    SEGMENT_COMPILER_OPTIONS)
    except Unsupported:
        raise
    except Exception as exc:  # noqa: BLE001 - XLA's refusal: the engine runs the call
        raise Unsupported(f"XLA cannot compile it ({type(exc).__name__})") from exc
    return built(found, executable)


def built(found: Traced, executable: Compiled) -> Built:
    """`found` with its executable: kept with a function of its own, traced when first
    inlined, with the final layout."""
    return Built(executable, jax.jit(found.function()))


def trace(params: CallParams, config: Config) -> Traced:
    """The call traced until its layout settles (raises `Unsupported` with the reason)."""
    call = describe(params)
    layout = Layout(races=bool(config.races), eager=config.dma_mode == DmaMode.EAGER,
                    fill=config.uninit.value, accessed_in_part=accessed_in_part(call.kernel))
    avals = [jax.ShapeDtypeStruct(tuple(a.shape), a.dtype) for a in _operand_avals(call)]

    def function() -> Compiled:
        """The call as a new function object each time: JAX keeps a function's traces, so
        a pass traced through the same object would be handed the first pass's trace."""
        def run(*operands: jax.Array) -> tuple[list[jax.Array], jax.Array, jax.Array]:
            return _run_call(call, layout, list(operands))
        return run

    jitted = jax.jit(function(), compiler_options=SEGMENT_COMPILER_OPTIONS)
    traced = jitted.trace(*avals)
    for _ in range(_MAX_RETRACES):
        # Again where a pass learnt something the trace depends on: a landing traced
        # before a DMA site was met (again, knowing them all), or a buffer kept with one
        # bool for its shadow that the kernel accessed in part (again, per element).
        if not (layout.stale or layout.refine):
            break
        if layout.stale:
            layout.frozen = True
        layout.stale = layout.refine = False
        jitted = jax.jit(function(), compiler_options=SEGMENT_COMPILER_OPTIONS)
        traced = jitted.trace(*avals)
    if layout.stale or layout.refine:
        raise Unsupported("its trace did not settle (DMA sites or buffer shadows)")
    layout.frozen = True  # every DMA site met: a later trace (inline) is this one
    return Traced(jitted, traced, avals, function)


def _operand_avals(call: CallDescription) -> list[Any]:
    """The call's operands: scalar prefetch, then the inputs."""
    scalars = [v.aval for v in call.kernel.invars[:call.num_scalars]]
    inputs = [jax.ShapeDtypeStruct(b.array_shape, b.array_dtype)
              for b in call.blocks[:call.num_inputs]]
    return [value_aval(a) for a in scalars] + inputs


def _run_call(call: CallDescription, layout: Layout, operands: list[jax.Array]
              ) -> tuple[list[jax.Array], jax.Array, jax.Array]:
    machine = Machine(layout)
    names = _arg_names(call)
    refs: list[Ref] = []
    for k in range(call.num_scalars):
        value = operands[k]
        refs.append(Ref.whole(machine.add_buffer(
            BufferInfo(names[k], tuple(value.shape), np.dtype(value.dtype), False, False),
            value), tuple(value.shape)))
    scalars = list(refs)
    piped: list[_Operand] = []
    outputs: list[int] = []
    for j, spec in enumerate(call.blocks):
        output = j >= call.num_inputs
        name = names[call.num_scalars + j]
        if not pipelined(spec):
            hbm = machine.add_buffer(
                BufferInfo(name, spec.array_shape, np.dtype(spec.array_dtype), output, False),
                None if output else operands[call.num_scalars + j])
            outputs += [hbm] if output else []
            refs.append(Ref.whole(hbm, spec.array_shape))
            continue
        padded = _padded_shape(spec) != spec.array_shape
        hbm = _pipelined_array(machine, name, spec, None if output else
                               operands[call.num_scalars + j])
        outputs += [hbm] if output else []
        var = call.kernel.invars[call.num_scalars + j]
        block = machine.add_buffer(BufferInfo(name, spec.kernel_shape,
                                              np.dtype(spec.array_dtype),
                                              output or padded, False),
                                   whole_shadow=output
                                   and var not in machine.layout.accessed_in_part)
        piped.append(_Operand(hbm, block, spec, output))
        refs.append(Ref.whole(block, spec.kernel_shape))
    first_scratch = len(machine.buffers)
    for k, aval in enumerate(call.scratch):
        refs.append(allocate(machine, names[len(refs)] if len(refs) < len(names)
                             else f"scratch{k}", aval, call.kernel.invars[len(refs)]))
    _grid_loop(call, machine, refs, scalars, piped)
    machine.finish()
    for b in range(first_scratch, len(machine.buffers)):
        shadow = machine.shadows[b]
        if shadow is not None:
            machine.flag(~all_set(shadow), Verdict.UNTOUCHED)
    results = []
    for b, aval in zip(outputs, call.out_avals):
        valid = tuple(slice(0, n) for n in aval.shape)  # (a padded array's own part)
        shadow = machine.shadows[b]
        assert shadow is not None
        machine.flag(~all_set(shadow[valid]), Verdict.UNWRITTEN_OUTPUT)
        results.append(machine.values[b][valid])
    return results, machine.verdict, machine.coverage


def _padded_shape(spec: Block) -> tuple[int, ...]:
    """The array grown to whole blocks (an edge block's padding lies past its end)."""
    return tuple(-(-n // d.size) * d.size for n, d in zip(spec.array_shape, spec.dims))


def _pipelined_array(machine: Machine, name: str, spec: Block, value: jax.Array | None
                     ) -> int:
    """A pipelined operand's array in HBM, grown to whole blocks where its blocks do not
    tile it: the padding is never-written memory (an input's is read from the block the
    pipeline copies in; an output's is never written back)."""
    shape, dtype = _padded_shape(spec), np.dtype(spec.array_dtype)
    output = value is None
    if shape == spec.array_shape:
        return machine.add_buffer(BufferInfo(name, shape, dtype, output, False), value)
    valid = tuple(slice(0, n) for n in spec.array_shape)
    grown = jnp.full(shape, fill_value(dtype, machine.layout.fill), dtype)
    b = machine.add_buffer(BufferInfo(name, shape, dtype, True, False),
                           grown if value is None else grown.at[valid].set(value))
    if value is not None:
        machine.shadows[b] = jnp.zeros(shape, bool).at[valid].set(True)
    return b


def _arg_names(call: CallDescription) -> list[str]:
    return arg_names(call.kernel)


def _grid_loop(call: CallDescription, machine: Machine, refs: list[Ref], scalars: list[Ref],
               piped: list[_Operand]) -> None:
    """Every grid step: the pipeline's copies, then the kernel body."""
    grid = tuple(int(n) for n in call.grid)
    total = math.prod(grid)
    if total == 0:
        return
    tracker = [_Tracking.first(op) for op in piped]
    start = machine.carry()
    counted: list[tuple[int, int]] = []

    def trace(assumed: bool, exits: list[bool]) -> Any:
        def step(t: jax.Array, carry: Any) -> Any:
            state, tracking = carry
            machine.enter(state, None, assumed)
            point = _grid_point(t, grid)
            evaluator = Evaluator(machine, point, grid)
            tracking = [_pipeline_step(evaluator, op, tr, t, scalars)
                        for op, tr in zip(piped, tracking)]
            evaluator.run(call.kernel, (), refs)
            counted.append(machine.take_counted())  # (added once, times the steps)
            return machine.leave(None, exits), tracking

        if total == 1:
            return step(jnp.int32(0), (start, tracker))
        return lax.fori_loop(0, total, step, (start, tracker))

    state, tracking = machine.loop(trace, total)
    machine.restore(state)
    machine.note_checked(counted[-1][0] * total, counted[-1][1])
    for op, tr in zip(piped, tracking):
        if op.output:
            _write_back(machine, op, tr.index, jnp.bool_(True))


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class _Tracking:
    """What the pipeline remembers of one operand: the block index it holds, and (an
    output) which blocks it has visited."""

    index: jax.Array  # int32 (rank,)
    visited: jax.Array  # bool, one per block of the array (an input: a placeholder)

    @classmethod
    def first(cls, op: _Operand) -> _Tracking:
        counts = _block_counts(op.spec)
        return cls(jnp.full(len(counts), -1, jnp.int32),
                   jnp.zeros(counts if op.output else (1,), bool))


def _block_counts(spec: Block) -> tuple[int, ...]:
    return tuple(-(-n // d.size) for n, d in zip(spec.array_shape, spec.dims))


def _grid_point(flat: jax.Array, grid: tuple[int, ...]) -> list[jax.Array]:
    """Row-major grid indices (the last axis fastest) of step `flat`."""
    point = []
    for size in reversed(grid):
        point.append((flat % size).astype(jnp.int32))
        flat = flat // size
    return list(reversed(point))


def _pipeline_step(ev: Evaluator, op: _Operand, tr: _Tracking, t: jax.Array,
                   scalars: Sequence[Ref]) -> _Tracking:
    machine = ev.machine
    spec = op.spec
    index = jnp.stack([jnp.asarray(i, jnp.int32) for i in ev.run(
        spec.index_map.jaxpr, spec.index_map.consts, [*ev.point, *scalars])])
    counts = np.array(_block_counts(spec), np.int32)
    machine.flag(jnp.any((index < 0) | (index >= counts)), Verdict.OUT_OF_BOUNDS)
    index = jnp.clip(index, 0, counts - 1)
    changed = (t == 0) | jnp.any(index != tr.index)
    sizes = tuple(d.size for d in spec.dims)
    block_at = [lax.index_in_dim(index, d, keepdims=False) for d in range(len(sizes))]
    starts = [lax.mul(i, np.int32(n)) for i, n in zip(block_at, sizes)]
    if not op.output:
        fresh = take(machine.values[op.hbm], starts, sizes)
        machine.values[op.block] = jnp.where(
            changed, fresh.reshape(spec.kernel_shape), machine.values[op.block])
        hbm_shadow, block_shadow = machine.shadows[op.hbm], machine.shadows[op.block]
        if hbm_shadow is not None and block_shadow is not None:  # padding: never written
            machine.shadows[op.block] = jnp.where(
                changed, take(hbm_shadow, starts, sizes).reshape(spec.kernel_shape),
                block_shadow)
        return _Tracking(index, tr.visited)
    moved = (t > 0) & jnp.any(index != tr.index)
    _write_back(machine, op, tr.index, moved)
    idx = tuple(block_at)
    machine.flag(moved & tr.visited[idx], Verdict.REVISIT)
    info = machine.buffers[op.block]
    block_shadow = machine.shadows[op.block]
    assert block_shadow is not None
    if machine.layout.swaps_read:  # (else nothing reads the fill unchecked: Layout)
        machine.values[op.block] = jnp.where(
            moved, jnp.full(info.shape, fill_value(info.dtype, machine.layout.fill),
                            info.dtype), machine.values[op.block])
    machine.shadows[op.block] = block_shadow & ~moved
    return _Tracking(index, tr.visited.at[idx].set(True))


def _write_back(machine: Machine, op: _Operand, index: jax.Array, when: jax.Array) -> None:
    """The output block goes to its place in HBM (where `when` holds)."""
    sizes = tuple(d.size for d in op.spec.dims)
    starts = [lax.mul(lax.max(lax.index_in_dim(index, d, keepdims=False), np.int32(0)),
                      np.int32(sizes[d])) for d in range(len(sizes))]
    block = machine.values[op.block].reshape(sizes)
    block_shadow = machine.shadows[op.block]
    hbm_shadow = machine.shadows[op.hbm]
    assert block_shadow is not None and hbm_shadow is not None
    here = take(machine.values[op.hbm], starts, sizes)
    here_shadow = take(hbm_shadow, starts, sizes)
    machine.values[op.hbm] = put(machine.values[op.hbm], jnp.where(when, block, here), starts)
    machine.shadows[op.hbm] = put(
        hbm_shadow, jnp.where(when, jnp.broadcast_to(block_shadow, op.spec.kernel_shape)
                              .reshape(sizes), here_shadow), starts)
