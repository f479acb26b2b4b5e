"""The fastest correct path of a call the filters pass through (`--calls`, `--kernel`):
the kernel compiled by XLA, written here, when nothing in it needs the engine.

A kernel with no DMA, no semaphore, no remote or device effect, no print or assertion of
its own, computes a pure function of its input blocks: one grid step reads its blocks,
runs its body, writes its output blocks. That is compiled here once per call structure
as one XLA computation -- a loop over the grid points (row-major, as a TPU core runs
them), each slicing its blocks at the block indices the index maps give, running the
kernel body with its refs discharged (refs become values, `program_id` the loop's grid
indices), and writing the output blocks back -- and run on the engine's private CPU client
(engine/backend.py), where the engine's own compiled pieces run. Outputs start as the
engine's never-written memory (the `--uninit` fill), an output aliased to an input as that
input, scratch likewise, carried from step to step: the values a checked run of a correct
kernel returns (to float rounding: XLA fuses the whole body where the engine compiles runs
of it, e.g. flash attention's outputs differ by at most 2.4e-7).

Any other kernel -- a DMA, a semaphore, a block that does not tile its array, scalar
prefetch, a dynamic grid, vmap's extra grid axes, a primitive that does not compile outside
a TPU lowering -- is answered None: the session runs it on the engine with its checks off.
This is not JAX's interpreter: only JAX's state discharge (as the engine uses for index
maps) and the primitives' own CPU lowerings.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Callable, Mapping, Sequence, cast

import numpy as np

from pallas_check.engine.jaxpr.program import SEGMENT_COMPILER_OPTIONS
from pallas_check.engine.memory.buffer import fill_value
from pallas_check.jaxbridge import params as eqn_params
from pallas_check.jaxbridge.call import Block, CallDescription, describe
from pallas_check.jaxbridge.jaxprs import discharge_state, sub_jaxprs, value_aval
from pallas_check.jaxbridge.types import Atom, ClosedJaxpr, DropVar, Jaxpr, Literal, ShapedArray, Var

if TYPE_CHECKING:  # JAX is imported where the path is taken (as below)
    import jax

# Primitives whose meaning is the TPU's (copies, counts, other devices, the kernel's own
# prints and checks): a kernel holding one runs on the engine. Matched on the primitive's
# name, in nested jaxprs too.
_ENGINE_ONLY = ("dma", "semaphore", "barrier", "device_id", "run_scoped", "print",
                "callback", "check", "delay", "prng", "random_", "core_map", "get_core", "remote")
_GRID_PRIMITIVES = ("program_id", "num_programs")

# What the grid loop carries: the outputs and the scratch values.
_Carry = tuple[list["jax.Array"], list["jax.Array"]]


def compiled_call(params: Mapping[str, object], fill: str
                  ) -> Callable[..., list[jax.Array]] | None:
    """The call compiled for the engine's CPU client (call it with the operands, in the
    engine device's `jax.default_device`: it returns the outputs), or None when the
    kernel needs the engine (see the module's docstring)."""
    call = describe(params)
    if not _plain_grid(call) or not _pure(call.kernel, top=True):
        return None
    import jax

    # (JAX leaves ShapeDtypeStruct, Literal and Jaxpr.replace unannotated)
    inputs = [jax.ShapeDtypeStruct(block.array_shape,  # type: ignore[no-untyped-call]
                                   block.array_dtype)
              for block in call.blocks[: call.num_inputs]]
    try:
        body = _discharged_body(call.kernel, tuple(call.grid))
        if body.effects:
            return None
        # Compiled now, so that a kernel XLA cannot compile outside a TPU lowering (a
        # primitive with no CPU rule) goes to the engine instead of failing its call.
        # With the engine's compiler options: no algebraic simplification, so that
        # never-written memory's NaN reaches what it reaches in the engine (`0 * x`).
        return jax.jit(functools.partial(_run_grid, call, body, fill),
                       compiler_options=SEGMENT_COMPILER_OPTIONS).lower(*inputs).compile()
    except Exception:  # noqa: BLE001 - not ours to compile: the engine runs it
        return None


def _plain_grid(call: CallDescription) -> bool:
    """A static grid, no scalar prefetch or vmap axes, and blocks that tile their arrays
    (each a VMEM/SMEM block: a ref in HBM is only reached by DMA)."""
    if call.num_scalars or call.batch_axes or call.num_grid_bounds or call.mesh is not None:
        return False  # (a mesh: a core_map kernel, its cores the engine's)
    if call.kernel.constvars or call.custom_grid_order:
        return False
    if not all(isinstance(n, int) for n in call.grid):
        return False
    for block in call.blocks:
        if str(block.memory_space).lower() in ("any", "hbm", "semaphore_mem") or block.transformed:
            return False
        for dim, size in zip(block.dims, block.array_shape):
            if dim.kind == "squeezed":
                continue
            if dim.kind != "blocked" or size % dim.size:
                return False
    for aval in call.scratch:
        if "sem" in str(getattr(aval, "dtype", "")).lower():
            return False
    return True


def _pure(jaxpr: Jaxpr, top: bool) -> bool:
    """No primitive of the TPU's own (_ENGINE_ONLY); grid queries only at the top level,
    where `_evaluate` answers them."""
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if any(word in name for word in _ENGINE_ONLY):
            return False
        if name in _GRID_PRIMITIVES and not top:
            return False
        for sub in sub_jaxprs(eqn):
            if not _pure(sub, top=False):
                return False
    return True


def _discharged_body(jaxpr: Jaxpr, grid: tuple[int, ...]) -> ClosedJaxpr:
    """The kernel as a pure function: its grid indices first, as scalar arguments in
    place of `program_id` (`num_programs` a literal), then every ref a value in and out
    (JAX's state discharge, which cannot trace `program_id` outside a TPU lowering)."""
    index_vars = [Var(ShapedArray((), np.int32)) for _ in grid]
    substitute: dict[Atom, Atom] = {}
    eqns = []
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name in _GRID_PRIMITIVES:
            axis = eqn_params.grid_axis(eqn)
            substitute[eqn.outvars[0]] = (
                index_vars[axis] if name == "program_id"
                else Literal(np.int32(grid[axis]),  # type: ignore[no-untyped-call]
                             eqn.outvars[0].aval))
            continue
        eqns.append(eqn.replace(invars=[substitute.get(v, v) if isinstance(v, Var)
                                        else v for v in eqn.invars]))
    pure_grid = jaxpr.replace(  # type: ignore[no-untyped-call]
        invars=[*index_vars, *jaxpr.invars], eqns=eqns,
        outvars=[substitute.get(v, v) for v in jaxpr.outvars])
    return discharge_state(ClosedJaxpr(pure_grid, ()))


def _evaluate(jaxpr: Jaxpr, consts: Sequence[object], args: Sequence[object]
              ) -> list[jax.Array]:
    """A pure jaxpr (the discharged kernel, an index map) traced into the caller's
    computation, equation by equation: every value it returns is traced (a jax.Array)."""
    env: dict[Var, object] = {}

    def read(atom: Atom) -> object:
        return atom.val if isinstance(atom, Literal) else env[atom]

    env.update(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in _GRID_PRIMITIVES:
            raise ValueError(f"{eqn.primitive.name} outside the kernel's top level")
        outs = eqn.primitive.bind(  # type: ignore[no-untyped-call]  # (JAX's, unannotated)
            *map(read, eqn.invars), **eqn_params.bind_params(eqn))
        if not eqn.primitive.multiple_results:
            outs = [outs]
        for var, value in zip(eqn.outvars, outs):
            if not isinstance(var, DropVar):
                env[var] = value
    return [cast("jax.Array", read(v)) for v in jaxpr.outvars]


def _run_grid(call: CallDescription, body: ClosedJaxpr, fill: str, *operands: jax.Array
              ) -> list[jax.Array]:
    """The call as one computation: outputs and scratch carried through the grid."""
    import jax
    import jax.numpy as jnp

    grid = tuple(int(n) for n in call.grid)
    inputs = operands[: call.num_inputs]
    aliases = dict((o, i) for i, o in call.aliases)
    outputs = [inputs[aliases[j]] if j in aliases
               else jnp.full(aval.shape, fill_value(aval.dtype, fill), aval.dtype)
               for j, aval in enumerate(call.out_avals)]
    scratch = [jnp.full(aval.shape, fill_value(aval.dtype, fill), aval.dtype)
               for aval in (value_aval(a) for a in call.scratch)]
    in_maps = call.blocks[: call.num_inputs]
    out_maps = call.blocks[call.num_inputs: call.num_inputs + call.num_outputs]

    def step(flat: jax.Array, carry: _Carry) -> _Carry:
        outs, scratch_values = carry
        point = _grid_point(flat, grid)
        blocks = [_block(x, block, point) for x, block in zip(inputs, in_maps)]
        out_blocks = [_block(x, block, point) for x, block in zip(outs, out_maps)]

        results = _evaluate(body.jaxpr, body.consts,
                            [*point, *blocks, *out_blocks, *scratch_values])
        n_in = len(blocks)
        new_outs = [_put_block(x, block, point, value) for x, block, value in
                    zip(outs, out_maps, results[n_in: n_in + len(outs)])]
        return new_outs, list(results[n_in + len(outs):])

    total = math.prod(grid)
    if total == 0:
        return outputs
    outputs, _ = jax.lax.fori_loop(0, total, step, (outputs, scratch))
    return list(outputs)


def _grid_point(flat: jax.Array, grid: tuple[int, ...]) -> list[jax.Array]:
    """Row-major grid indices (the last axis fastest) of step `flat`."""
    point = []
    for size in reversed(grid):
        point.append(flat % size)
        flat = flat // size
    return [p.astype(np.int32) for p in reversed(point)]


def _starts(block: Block, point: list[jax.Array]) -> list[jax.Array | np.int32]:
    """The element offset of the block in each dimension of its array."""
    indices = _evaluate(block.index_map.jaxpr, block.index_map.consts, point)
    starts: list[jax.Array | np.int32] = []
    for dim, index in zip(block.dims, indices):
        size = dim.size
        starts.append(index.astype(np.int32) * size if hasattr(index, "astype")
                      else np.int32(index * size))
    return starts


def _sizes(block: Block) -> tuple[int, ...]:
    return tuple(d.size for d in block.dims)


def _block(array: jax.Array, block: Block, point: list[jax.Array]) -> jax.Array:
    import jax

    values = jax.lax.dynamic_slice(array, _starts(block, point), _sizes(block))
    return values.reshape(block.kernel_shape)


def _put_block(array: jax.Array, block: Block, point: list[jax.Array], value: jax.Array
               ) -> jax.Array:
    import jax

    return jax.lax.dynamic_update_slice(array, value.reshape(_sizes(block)),
                                        _starts(block, point))
