"""KV-cache updates: new tokens' keys/values written into their slots of a cache that
stays in HBM (aliased input -> output), one DMA per token, and a page-granular variant
that writes whole pages (a prefill chunk) by prefetched page numbers."""

from __future__ import annotations

import functools

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _token_kernel(slots_ref, new_ref, cache_in, cache_out, sem, *, tokens: int):
    del cache_in  # the same buffer as cache_out
    copies = [pltpu.make_async_copy(new_ref.at[pl.ds(t, 1)],
                                    cache_out.at[pl.ds(slots_ref[t], 1)], sem)
              for t in range(tokens)]
    for copy in copies:
        copy.start()
    for copy in copies:
        copy.wait()


@functools.partial(jax.jit, donate_argnums=0)
def write_tokens(cache: jax.Array, new: jax.Array, slots: jax.Array) -> jax.Array:
    """cache (slots_total, D), new (T, D), slots (T,) distinct: cache[slots] = new."""
    tokens = new.shape[0]
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(1,),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        scratch_shapes=[pltpu.SemaphoreType.DMA(())])
    return pl.pallas_call(
        functools.partial(_token_kernel, tokens=tokens), grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct(cache.shape, cache.dtype),
        input_output_aliases={2: 0})(slots, new, cache)


def _page_kernel(pages_ref, new_ref, cache_in, cache_out):
    del pages_ref, cache_in
    cache_out[...] = new_ref[...]


@functools.partial(jax.jit, donate_argnums=0)
def write_pages(cache: jax.Array, new: jax.Array, pages: jax.Array) -> jax.Array:
    """cache (P, page, D), new (n, page, D): cache[pages[i]] = new[i]; the other pages keep
    their contents (the output aliases the cache and only written blocks change)."""
    n, page, d = new.shape
    block = (None, page, d)
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(n,),
        in_specs=[pl.BlockSpec(block, lambda i, pages: (i, 0, 0)),
                  pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(block, lambda i, pages: (pages[i], 0, 0)))
    return pl.pallas_call(
        _page_kernel, grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct(cache.shape, cache.dtype),
        input_output_aliases={2: 0})(pages, new, cache)
