"""Row gathers driven by prefetched indices: through the index map (one row block per grid
step), and by manual DMAs from HBM (a block of rows per step, one copy each, all in
flight together), as embedding lookups do on the TensorCore."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _copy_kernel(indices_ref, row_ref, o_ref):
    del indices_ref
    o_ref[...] = row_ref[...]


@jax.jit
def gather_tiles(table: jax.Array, indices: jax.Array) -> jax.Array:
    """table (N, R, D), indices (M,) -> (M, R, D): each grid step fetches one tile."""
    _, r, d = table.shape
    (m,) = indices.shape
    spec_in = pl.BlockSpec((None, r, d), lambda i, idx: (idx[i], 0, 0))
    spec_out = pl.BlockSpec((None, r, d), lambda i, idx: (i, 0, 0))
    return pl.pallas_call(
        _copy_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(m,),
                                               in_specs=[spec_in], out_specs=spec_out),
        out_shape=jax.ShapeDtypeStruct((m, r, d), table.dtype))(indices, table)


def _dma_gather_kernel(indices_ref, table_hbm, o_ref, rows_vmem, sems, *, rows: int,
                       scale: float):
    base = pl.program_id(0) * rows
    copies = [pltpu.make_async_copy(table_hbm.at[pl.ds(indices_ref[base + r], 1)],
                                    rows_vmem.at[pl.ds(r, 1)], sems.at[r])
              for r in range(rows)]
    for copy in copies:
        copy.start()
    for copy in copies:
        copy.wait()
    o_ref[...] = (rows_vmem[...].astype(jnp.float32) * scale).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("rows", "scale"))
def embedding_lookup(table: jax.Array, ids: jax.Array, rows: int = 8,
                     scale: float = 1.0) -> jax.Array:
    """table (V, D) in HBM, ids (M,) -> scale * table[ids], `rows` DMAs in flight a step."""
    _, d = table.shape
    (m,) = ids.shape
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(m // rows,),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((rows, d), lambda i, ids: (i, 0)),
        scratch_shapes=[pltpu.VMEM((rows, d), table.dtype),
                        pltpu.SemaphoreType.DMA((rows,))])
    return pl.pallas_call(
        functools.partial(_dma_gather_kernel, rows=rows, scale=scale), grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((m, d), table.dtype))(ids, table)
