"""The small kernels of benchmarks/first_call.py (issue 55, item 3), each with its inputs and
a jax.numpy reference.

    fn, args, reference = KERNELS["matmul"](interpret)

`interpret` is what `pl.pallas_call` is given: False under pallas-check (which intercepts
the call whatever it says), `pltpu.InterpretParams(...)` for JAX's TPU interpreter, True
for its HLO interpreter. `fn` is the jitted call.

- `elementwise`: `x * 2 + y`, blocks (8, 128) f32, grid 4.
- `reduction`: column sums of (64, 128) f32 into one (8, 128) output block revisited over
  an `arbitrary` grid of 4, initialised under `pl.when(program_id == 0)`.
- `matmul`: (256, 256) @ (256, 256) f32, blocks 128, grid (2, 2, 2) with a VMEM
  accumulator (`parallel, parallel, arbitrary`).
- `prefetch`: a gather of (8, 128) blocks by a scalar-prefetched index table
  (`PrefetchScalarGridSpec`, the table read in the index map and in the kernel).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

Made = tuple[Callable[..., Any], tuple[jax.Array, ...], Callable[..., jax.Array]]


def elementwise(interpret: Any) -> Made:
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0 + y_ref[...]

    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    call = pl.pallas_call(kernel, grid=(4,), in_specs=[spec, spec], out_specs=spec,
                          out_shape=jax.ShapeDtypeStruct((32, 128), jnp.float32),
                          interpret=interpret)
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    return jax.jit(call), (x, x + 1), lambda x, y: x * 2 + y


def reduction(interpret: Any) -> Made:
    def kernel(x_ref, o_ref):
        @pl.when(pl.program_id(0) == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += jnp.broadcast_to(jnp.sum(x_ref[...], axis=0, keepdims=True), (8, 128))

    call = pl.pallas_call(
        kernel, grid=(4,), in_specs=[pl.BlockSpec((16, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
        interpret=interpret)
    x = jnp.arange(64 * 128, dtype=jnp.float32).reshape(64, 128) / 1000
    return (jax.jit(call), (x,),
            lambda x: jnp.broadcast_to(x.sum(0, keepdims=True), (8, 128)))


def matmul(interpret: Any) -> Made:
    block = 128

    def kernel(a_ref, b_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
        def _():
            o_ref[...] = acc_ref[...]

    call = pl.pallas_call(
        kernel, grid=(2, 2, 2),
        in_specs=[pl.BlockSpec((block, block), lambda i, j, k: (i, k)),
                  pl.BlockSpec((block, block), lambda i, j, k: (k, j))],
        out_specs=pl.BlockSpec((block, block), lambda i, j, k: (i, j)),
        out_shape=jax.ShapeDtypeStruct((256, 256), jnp.float32),
        scratch_shapes=[pltpu.VMEM((block, block), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=interpret)
    # Multiples of 1/8 below 1: exact in bfloat16, so the chip's rounding of a default-
    # precision product (pallas-check's chip arithmetic) changes nothing.
    a = (jnp.arange(256 * 256, dtype=jnp.float32).reshape(256, 256) % 7) / 8
    return jax.jit(call), (a, a.T), lambda a, b: jnp.dot(a, b, precision="highest")


def prefetch(interpret: Any) -> Made:
    def kernel(idx_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...] + idx_ref[pl.program_id(0)].astype(jnp.float32)

    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(4,),
        in_specs=[pl.BlockSpec((8, 128), lambda i, idx: (idx[i], 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i, idx: (i, 0)))
    call = pl.pallas_call(kernel, grid_spec=grid_spec,
                          out_shape=jax.ShapeDtypeStruct((32, 128), jnp.float32),
                          interpret=interpret)
    idx = jnp.array([3, 0, 2, 1], jnp.int32)
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)

    def reference(idx: jax.Array, x: jax.Array) -> jax.Array:
        blocks = x.reshape(4, 8, 128)[idx]
        return (blocks + idx[:, None, None].astype(jnp.float32)).reshape(32, 128)

    return jax.jit(call), (idx, x), reference


KERNELS: dict[str, Callable[[Any], Made]] = {
    "elementwise": elementwise, "reduction": reduction, "matmul": matmul,
    "prefetch": prefetch}


def interpret_for(mode: str) -> Any:
    """What `pl.pallas_call` is given under each of first_call.py's modes."""
    if mode.startswith("pc"):
        return False
    if mode == "hlo":
        return True
    return pltpu.InterpretParams(detect_races=mode == "tpu-races")
