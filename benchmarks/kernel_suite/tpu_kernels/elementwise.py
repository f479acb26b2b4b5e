"""Small elementwise kernels: add, scaled GELU, SwiGLU's gate, a clamp with a scalar from
SMEM. Row blocks of (block_rows, full width)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _row_spec(block_rows: int, width: int) -> pl.BlockSpec:
    return pl.BlockSpec((block_rows, width), lambda i: (i, 0))


def _rows_call(kernel, x: jax.Array, n_inputs: int, block_rows: int, out_dtype=None):
    rows, width = x.shape
    assert rows % block_rows == 0, (rows, block_rows)
    spec = _row_spec(block_rows, width)
    return pl.pallas_call(
        kernel, grid=(rows // block_rows,), in_specs=[spec] * n_inputs, out_specs=spec,
        out_shape=jax.ShapeDtypeStruct(x.shape, out_dtype or x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)))


def _add_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]


@functools.partial(jax.jit, static_argnames="block_rows")
def add(x: jax.Array, y: jax.Array, block_rows: int = 8) -> jax.Array:
    return _rows_call(_add_kernel, x, 2, block_rows)(x, y)


def _gelu_kernel(x_ref, o_ref, *, scale: float):
    x = x_ref[...].astype(jnp.float32)
    inner = 0.7978845608 * (x + 0.044715 * x * x * x)
    o_ref[...] = (scale * 0.5 * x * (1.0 + jnp.tanh(inner))).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("scale", "block_rows"))
def scaled_gelu(x: jax.Array, scale: float = 1.0, block_rows: int = 8) -> jax.Array:
    return _rows_call(functools.partial(_gelu_kernel, scale=scale), x, 1, block_rows)(x)


def _swiglu_kernel(gate_ref, up_ref, o_ref):
    gate = gate_ref[...].astype(jnp.float32)
    up = up_ref[...].astype(jnp.float32)
    o_ref[...] = (gate * jax.nn.sigmoid(gate) * up).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames="block_rows")
def swiglu(gate: jax.Array, up: jax.Array, block_rows: int = 16) -> jax.Array:
    return _rows_call(_swiglu_kernel, gate, 2, block_rows)(gate, up)


def _clamp_kernel(bounds_ref, x_ref, o_ref):
    o_ref[...] = jnp.clip(x_ref[...], bounds_ref[0], bounds_ref[1])


@functools.partial(jax.jit, static_argnames="block_rows")
def clamp(x: jax.Array, low: jax.Array, high: jax.Array, block_rows: int = 8) -> jax.Array:
    """Clamp to [low, high], the bounds read from SMEM (runtime values, no retrace)."""
    rows, width = x.shape
    bounds = jnp.stack([low, high]).astype(x.dtype)
    return pl.pallas_call(
        _clamp_kernel, grid=(rows // block_rows,),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), _row_spec(block_rows, width)],
        out_specs=_row_spec(block_rows, width),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(bounds, x)
