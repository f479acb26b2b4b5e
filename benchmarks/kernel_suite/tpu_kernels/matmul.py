"""Tiled matmul: (M/bm, N/bn, K/bk) grid, float32 accumulator in VMEM scratch, written on
the last K step; optional fused bias and ReLU."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _matmul_kernel(x_ref, y_ref, *rest, precision, activation: str | None, has_bias: bool):
    if has_bias:
        bias_ref, o_ref, acc_ref = rest
    else:
        (o_ref, acc_ref), bias_ref = rest, None

    @pl.when(pl.program_id(2) == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32,
                            precision=precision)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _():
        out = acc_ref[...]
        if bias_ref is not None:
            out = out + bias_ref[...].astype(jnp.float32)
        if activation == "relu":
            out = jnp.maximum(out, 0.0)
        o_ref[...] = out.astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bm", "bn", "bk", "precision", "activation"))
def matmul(x, y, bias=None, *, bm: int = 128, bn: int = 128, bk: int = 128,
           precision=None, activation: str | None = None):
    m, k = x.shape
    _, n = y.shape
    in_specs = [pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))]
    args = [x, y]
    if bias is not None:
        in_specs.append(pl.BlockSpec((1, bn), lambda i, j, kk: (0, j)))
        args.append(bias.reshape(1, n))
    kernel = functools.partial(_matmul_kernel, precision=precision, activation=activation,
                               has_bias=bias is not None)
    return pl.pallas_call(
        kernel, grid=(m // bm, n // bn, k // bk), in_specs=in_specs,
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")))(*args)
