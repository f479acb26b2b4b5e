"""Quantized matmuls: int8 weights with a float scale per output column (weight-only), and
int8 x int8 with int32 accumulation and per-row / per-column scales (w8a8)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def quantize_columns(w: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Symmetric int8 per column of w (K, N): (int8 weights, float32 scales (N,))."""
    scale = jnp.max(jnp.abs(w), axis=0) / 127.0
    scale = jnp.where(scale == 0, 1.0, scale)
    return jnp.round(w / scale).astype(jnp.int8), scale.astype(jnp.float32)


def quantize_rows(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    scale = jnp.max(jnp.abs(x), axis=1) / 127.0
    scale = jnp.where(scale == 0, 1.0, scale)
    return jnp.round(x / scale[:, None]).astype(jnp.int8), scale.astype(jnp.float32)


def _weight_only_kernel(x_ref, w_ref, scale_ref, o_ref, acc_ref, *, precision):
    @pl.when(pl.program_id(2) == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    w = w_ref[...].astype(x_ref.dtype)
    acc_ref[...] += jnp.dot(x_ref[...], w, preferred_element_type=jnp.float32,
                            precision=precision)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = (acc_ref[...] * scale_ref[...]).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bm", "bn", "bk", "precision"))
def weight_only_matmul(x, w_int8, scales, *, bm=64, bn=128, bk=128, precision=None):
    m, k = x.shape
    n = w_int8.shape[1]
    return pl.pallas_call(
        functools.partial(_weight_only_kernel, precision=precision),
        grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
                  pl.BlockSpec((1, bn), lambda i, j, kk: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")))(
        x, w_int8, scales.reshape(1, n))


def _w8a8_kernel(x_ref, w_ref, x_scale_ref, w_scale_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(1) == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.int32)

    @pl.when(pl.program_id(1) == pl.num_programs(1) - 1)
    def _():
        scaled = acc_ref[...].astype(jnp.float32) * x_scale_ref[...] * w_scale_ref[...]
        o_ref[...] = scaled.astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bm", "bk"))
def w8a8_matmul(x_int8, w_int8, x_scales, w_scales, *, bm=64, bk=128):
    m, k = x_int8.shape
    n = w_int8.shape[1]
    return pl.pallas_call(
        _w8a8_kernel, grid=(m // bm, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, kk: (i, kk)),
                  pl.BlockSpec((bk, n), lambda i, kk: (kk, 0)),
                  pl.BlockSpec((bm, 1), lambda i, kk: (i, 0)),
                  pl.BlockSpec((1, n), lambda i, kk: (0, 0))],
        out_specs=pl.BlockSpec((bm, n), lambda i, kk: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        scratch_shapes=[pltpu.VMEM((bm, n), jnp.int32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")))(
        x_int8, w_int8, x_scales.reshape(m, 1), w_scales.reshape(1, n))
