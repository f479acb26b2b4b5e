"""A gated linear recurrence (gated linear attention, small): per head a state
S (Dk, Dv) decays by a per-step gate and takes the outer product k_t v_tᵀ; the output is
q_t S_t. Time is cut in chunks (the grid's last, "arbitrary" axis); inside a chunk a
`fori_loop` steps token by token, the state carried in VMEM scratch across chunks."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

HIGHEST = jax.lax.Precision.HIGHEST


def _kernel(q_ref, k_ref, v_ref, g_ref, o_ref, state_ref, *, chunk: int):
    @pl.when(pl.program_id(1) == 0)
    def _():
        state_ref[...] = jnp.zeros_like(state_ref)

    def step(t, carry):
        q = q_ref[pl.ds(t, 1), :].astype(jnp.float32)   # (1, Dk)
        k = k_ref[pl.ds(t, 1), :].astype(jnp.float32)   # (1, Dk)
        v = v_ref[pl.ds(t, 1), :].astype(jnp.float32)   # (1, Dv)
        gate = g_ref[pl.ds(t, 1), :].astype(jnp.float32)  # (1, Dk): decay per key dim
        outer = jax.lax.dot_general(k, v, (((0,), (0,)), ((), ())), precision=HIGHEST)
        state = state_ref[...] * gate.T + outer
        state_ref[...] = state
        o_ref[pl.ds(t, 1), :] = jnp.dot(q, state, precision=HIGHEST).astype(o_ref.dtype)
        return carry

    jax.lax.fori_loop(0, chunk, step, 0)


@functools.partial(jax.jit, static_argnames="chunk")
def gated_linear_attention(q, k, v, gates, *, chunk: int = 16):
    """q, k, gates (BH, T, Dk); v (BH, T, Dv) -> (BH, T, Dv); gates in (0, 1)."""
    bh, t, dk = q.shape
    dv = v.shape[-1]
    key = pl.BlockSpec((None, chunk, dk), lambda h, c: (h, c, 0))
    val = pl.BlockSpec((None, chunk, dv), lambda h, c: (h, c, 0))
    return pl.pallas_call(
        functools.partial(_kernel, chunk=chunk), grid=(bh, t // chunk),
        in_specs=[key, key, val, key], out_specs=val,
        out_shape=jax.ShapeDtypeStruct(v.shape, v.dtype),
        scratch_shapes=[pltpu.VMEM((dk, dv), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")))(
        q, k, v, gates)
