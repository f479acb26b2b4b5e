"""Fused MLP block: out = act(x @ w1 + b1) @ w2, tiled over the hidden dimension with the
output accumulated in float32 scratch (the hidden activations never reach HBM)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _mlp_kernel(x_ref, w1_ref, b1_ref, w2_ref, o_ref, acc_ref, *, activation, precision):
    @pl.when(pl.program_id(1) == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    hidden = jnp.dot(x_ref[...], w1_ref[...], preferred_element_type=jnp.float32,
                     precision=precision) + b1_ref[...]
    if activation == "gelu":
        hidden = jax.nn.gelu(hidden, approximate=True)
    else:
        hidden = jax.nn.silu(hidden)
    acc_ref[...] += jnp.dot(hidden.astype(w2_ref.dtype), w2_ref[...],
                            preferred_element_type=jnp.float32, precision=precision)

    @pl.when(pl.program_id(1) == pl.num_programs(1) - 1)
    def _():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("activation", "bm", "bh", "precision"))
def fused_mlp(x, w1, b1, w2, *, activation: str = "gelu", bm: int = 64, bh: int = 128,
              precision=None):
    m, d = x.shape
    hidden = w1.shape[1]
    return pl.pallas_call(
        functools.partial(_mlp_kernel, activation=activation, precision=precision),
        grid=(m // bm, hidden // bh),
        in_specs=[pl.BlockSpec((bm, d), lambda i, h: (i, 0)),
                  pl.BlockSpec((d, bh), lambda i, h: (0, h)),
                  pl.BlockSpec((1, bh), lambda i, h: (0, h)),
                  pl.BlockSpec((bh, d), lambda i, h: (h, 0))],
        out_specs=pl.BlockSpec((bm, d), lambda i, h: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((m, d), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, d), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")))(
        x, w1, b1.reshape(1, hidden).astype(jnp.float32), w2)
