"""Reductions: column sums accumulated across row blocks in a resident output block (the
row axis is "arbitrary"), row maxima, and a global sum of squares in an SMEM scalar."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _column_sum_kernel(x_ref, o_ref):
    @pl.when(pl.program_id(1) == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.sum(x_ref[...].astype(jnp.float32), axis=0, keepdims=True)


@functools.partial(jax.jit, static_argnames=("block_rows", "block_cols"))
def column_sum(x: jax.Array, block_rows: int = 16, block_cols: int = 128) -> jax.Array:
    rows, cols = x.shape
    return pl.pallas_call(
        _column_sum_kernel, grid=(cols // block_cols, rows // block_rows),
        in_specs=[pl.BlockSpec((block_rows, block_cols), lambda j, i: (i, j))],
        out_specs=pl.BlockSpec((1, block_cols), lambda j, i: (0, j)),
        out_shape=jax.ShapeDtypeStruct((1, cols), jnp.float32),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary")))(x)[0]


def _row_max_kernel(x_ref, o_ref):
    o_ref[...] = jnp.max(x_ref[...], axis=-1, keepdims=True)


@functools.partial(jax.jit, static_argnames="block_rows")
def row_max(x: jax.Array, block_rows: int = 8) -> jax.Array:
    rows, cols = x.shape
    return pl.pallas_call(
        _row_max_kernel, grid=(rows // block_rows,),
        in_specs=[pl.BlockSpec((block_rows, cols), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((block_rows, 1), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((rows, 1), x.dtype))(x)[:, 0]


def _sum_squares_kernel(x_ref, o_ref):
    @pl.when(pl.program_id(0) == 0)
    def _():
        o_ref[0, 0] = 0.0

    x = x_ref[...].astype(jnp.float32)
    o_ref[0, 0] += jnp.sum(x * x)


@functools.partial(jax.jit, static_argnames="block_rows")
def sum_of_squares(x: jax.Array, block_rows: int = 32) -> jax.Array:
    rows, cols = x.shape
    return pl.pallas_call(
        _sum_squares_kernel, grid=(rows // block_rows,),
        in_specs=[pl.BlockSpec((block_rows, cols), lambda i: (i, 0))],
        out_specs=pl.BlockSpec(memory_space=pltpu.SMEM),
        out_shape=jax.ShapeDtypeStruct((1, 1), jnp.float32),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)))(x)[0, 0]
