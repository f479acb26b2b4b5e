"""Kernels over HBM refs whose bodies run `pltpu.emit_pipeline`: a residual update
(out = x * gain + residual) walking row blocks, and a matmul whose outer grid hands each
step a column slab of the output and whose inner pipeline walks (row, K) blocks,
accumulating each output block in place."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

ANY = pl.BlockSpec(memory_space=pl.ANY)


def _residual_kernel(x_hbm, r_hbm, o_hbm, *, block_rows: int, gain: float):
    def body(x_ref, r_ref, o_ref):
        o_ref[...] = x_ref[...] * gain + r_ref[...]

    spec = pl.BlockSpec((block_rows, x_hbm.shape[1]), lambda i: (i, 0))
    pltpu.emit_pipeline(body, grid=(x_hbm.shape[0] // block_rows,),
                        in_specs=[spec, spec], out_specs=[spec])(x_hbm, r_hbm, o_hbm)


@functools.partial(jax.jit, static_argnames=("gain", "block_rows"))
def residual_update(x, residual, gain: float = 0.5, block_rows: int = 32):
    return pl.pallas_call(
        functools.partial(_residual_kernel, block_rows=block_rows, gain=gain),
        in_specs=[ANY, ANY], out_specs=ANY,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, residual)


def _matmul_kernel(x_hbm, w_hbm, o_hbm, *, bm: int, bk: int, slab: int):
    columns = pl.ds(pl.multiple_of(pl.program_id(0) * slab, slab), slab)

    def body(x_ref, w_ref, o_ref):
        @pl.when(pl.program_id(1) == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += jnp.dot(x_ref[...], w_ref[...], precision=jax.lax.Precision.HIGHEST,
                              preferred_element_type=jnp.float32)

    m, k = x_hbm.shape
    pltpu.emit_pipeline(
        body, grid=(m // bm, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, kk: (i, kk)),
                  pl.BlockSpec((bk, slab), lambda i, kk: (kk, 0))],
        out_specs=[pl.BlockSpec((bm, slab), lambda i, kk: (i, 0))],
    )(x_hbm, w_hbm.at[:, columns], o_hbm.at[:, columns])


@functools.partial(jax.jit, static_argnames=("bm", "bk", "slab"))
def slab_matmul(x, w, bm: int = 64, bk: int = 128, slab: int = 128):
    n = w.shape[1]
    return pl.pallas_call(
        functools.partial(_matmul_kernel, bm=bm, bk=bk, slab=slab), grid=(n // slab,),
        in_specs=[ANY, ANY], out_specs=ANY,
        out_shape=jax.ShapeDtypeStruct((x.shape[0], n), jnp.float32),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)))(x, w)
