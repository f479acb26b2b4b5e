"""Probe: a ragged last block through `pl.BoundedSlice` in `emit_pipeline`.

Rows = 200 in blocks of 128: the second block holds 72 rows. Three kernels, each an
`emit_pipeline` inside a `pallas_call` over HBM refs:
- `copy`: out = x + 1, block (BoundedSlice(128), 128), index map `pl.ds(i*128, size)`
  with size the exact remainder (`exact`) or the full 128 (`full`, the pipeline clips it);
- `acc`: out[b] = sum over k of x[b, k-block] (the output block revisited across k);
- `lse`: a tiled linear + log-sum-exp: grid (batch, n, k), BoundedSlice on every block
  dimension, the batch axis PARALLEL, the logits tile accumulated over k in a scratch and
  an online log-sum-exp over n; out = lse broadcast to 128 lanes.
Each output starts as the `fill` operand (aliased), so rows the kernel never writes show.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from common import Results, call, main_guard

ROWS, BLK = 200, 128
NB = pl.cdiv(ROWS, BLK)


def rows_of(i, full: bool):
    start = i * BLK
    size = BLK if full else jnp.minimum(BLK, ROWS - start)
    return pl.ds(pl.multiple_of(start, 8), size)


def copy_kernel(full: bool, cols: int):
    def kernel(x_hbm, fill_hbm, o_hbm):
        del fill_hbm

        def body(x_ref, o_ref):
            o_ref[...] = x_ref[...] + 1.0
        spec = pl.BlockSpec((pl.BoundedSlice(BLK), cols), lambda i: (rows_of(i, full), 0))
        pltpu.emit_pipeline(body, grid=(NB,), in_specs=[spec], out_specs=[spec])(x_hbm, o_hbm)
    return kernel


def acc_kernel(full: bool, kb: int):
    def kernel(x_hbm, fill_hbm, o_hbm):
        del fill_hbm

        def body(x_ref, o_ref):
            @pl.when(pl.program_id(1) == 0)
            def _():
                o_ref[...] = jnp.zeros_like(o_ref)
            o_ref[...] += x_ref[...]
        in_spec = pl.BlockSpec((pl.BoundedSlice(BLK), 128),
                               lambda i, k: (rows_of(i, full), k))
        out_spec = pl.BlockSpec((pl.BoundedSlice(BLK), 128),
                                lambda i, k: (rows_of(i, full), 0))
        pltpu.emit_pipeline(body, grid=(NB, kb), in_specs=[in_spec],
                            out_specs=[out_spec])(x_hbm, o_hbm)
    return kernel


def lse_kernel(full: bool, nb: int, kb: int, precision):
    def kernel(x_hbm, w_hbm, fill_hbm, o_hbm, acc, m, l):
        del fill_hbm

        def body(x_ref, w_ref, o_ref):
            n, k = pl.program_id(1), pl.program_id(2)

            @pl.when(k == 0)
            def _():
                acc[...] = jnp.zeros_like(acc)
            acc[...] += jnp.dot(x_ref[...], w_ref[...], precision=precision,
                                preferred_element_type=jnp.float32)

            @pl.when(jnp.logical_and(n == 0, k == 0))
            def _():
                m[...] = jnp.full_like(m, -jnp.inf)
                l[...] = jnp.zeros_like(l)

            @pl.when(k == kb - 1)
            def _():
                tile = acc[...]
                m_new = jnp.maximum(m[...], jnp.max(tile, axis=1, keepdims=True))
                l[...] = (l[...] * jnp.exp(m[...] - m_new)
                          + jnp.sum(jnp.exp(tile - m_new), axis=1, keepdims=True))
                m[...] = m_new

            @pl.when(jnp.logical_and(n == nb - 1, k == kb - 1))
            def _():
                o_ref[...] = jnp.broadcast_to(m[...] + jnp.log(l[...]), o_ref.shape)
        x_spec = pl.BlockSpec((pl.BoundedSlice(BLK), pl.BoundedSlice(128)),
                              lambda b, n, k: (rows_of(b, full), pl.ds(k * 128, 128)))
        w_spec = pl.BlockSpec((pl.BoundedSlice(128), pl.BoundedSlice(128)),
                              lambda b, n, k: (pl.ds(k * 128, 128), pl.ds(n * 128, 128)))
        o_spec = pl.BlockSpec((pl.BoundedSlice(BLK), pl.BoundedSlice(128)),
                              lambda b, n, k: (rows_of(b, full), pl.ds(0, 128)))
        pltpu.emit_pipeline(body, grid=(NB, nb, kb), in_specs=[x_spec, w_spec],
                            out_specs=[o_spec],
                            dimension_semantics=(pltpu.PARALLEL, pltpu.ARBITRARY,
                                                 pltpu.ARBITRARY))(x_hbm, w_hbm, o_hbm)
    return kernel


def any_call(kernel, out_shape, n_in, scratch=()):
    return call(kernel, out_shape=out_shape,
                in_specs=[pl.BlockSpec(memory_space=pl.ANY)] * n_in,
                out_specs=pl.BlockSpec(memory_space=pl.ANY),
                scratch_shapes=list(scratch),
                input_output_aliases={n_in - 1: 0})


def run(r: Results) -> None:
    rng = np.random.default_rng(3)
    fill = np.full((ROWS, 128), -7.0, np.float32)
    x = rng.standard_normal((ROWS, 128)).astype(np.float32)
    r.array("copy.x", x)
    for full in (False, True):
        tag = "full" if full else "exact"
        r.case(f"copy.{tag}", functools.partial(
            jax.jit(any_call(copy_kernel(full, 128), jax.ShapeDtypeStruct(x.shape, x.dtype), 2)),
            x, fill))
    kb = 3
    xa = rng.standard_normal((ROWS, 128 * kb)).astype(np.float32)
    r.array("acc.x", xa)
    for full in (False, True):
        tag = "full" if full else "exact"
        r.case(f"acc.{tag}", functools.partial(
            jax.jit(any_call(acc_kernel(full, kb), jax.ShapeDtypeStruct(fill.shape, fill.dtype), 2)),
            xa, fill))
    nb, kb = 4, 2
    xl = rng.standard_normal((ROWS, 128 * kb)).astype(np.float32)
    wl = (rng.standard_normal((128 * kb, 128 * nb)) * 0.2).astype(np.float32)
    r.array("lse.x", xl)
    r.array("lse.w", wl)
    scratch = [pltpu.VMEM((BLK, 128), jnp.float32), pltpu.VMEM((BLK, 1), jnp.float32),
               pltpu.VMEM((BLK, 1), jnp.float32)]
    for full in (False, True):
        for pname, prec in (("highest", jax.lax.Precision.HIGHEST), ("default", None)):
            tag = ("full" if full else "exact") + "." + pname
            r.case(f"lse.{tag}", functools.partial(
                jax.jit(any_call(lse_kernel(full, nb, kb, prec),
                                 jax.ShapeDtypeStruct(fill.shape, fill.dtype), 3, scratch)),
                xl, wl, fill))


if __name__ == "__main__":
    main_guard(run, "bounded")
