"""What the compiled tier reads off a kernel's jaxpr without tracing it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_check.compiled.jaxpr_facts import accessed_in_part


def _kernel(x_hbm, o_ref, whole, pages, halves, sem):
    """`whole` is only ever accessed whole; `pages` gets a DMA into one page of it at a
    time; `halves` is stored in two halves inside a branch; a scoped buffer is loaded in
    part inside a loop, another only whole."""
    whole[...] = jnp.zeros_like(whole)
    for i in range(2):
        pltpu.sync_copy(x_hbm.at[i], pages.at[i])

    @pl.when(pl.program_id(0) == 0)
    def _():
        halves[0:4, :] = pages[0][0:4, :]
        halves[4:8, :] = pages[1][4:8, :]

    def scoped(part, full):
        part[...] = whole[...]
        full[...] = whole[...]

        def trip(i, total):
            return total + part[pl.ds(i * 4, 4), :].sum() + full[...].sum()

        o_ref[...] = halves[...] + jax.lax.fori_loop(0, 2, trip, 0.0) + whole[...]

    pl.run_scoped(scoped, pltpu.VMEM((8, 128), jnp.float32),
                  pltpu.VMEM((8, 128), jnp.float32))


def test_the_refs_some_access_covers_in_part_are_found_before_tracing():
    call = pl.pallas_call(
        _kernel, grid=(1,),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32),
                        pltpu.VMEM((2, 8, 128), jnp.float32),
                        pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA])
    kernel = jax.make_jaxpr(call)(jnp.zeros((2, 8, 128), jnp.float32)).jaxpr.eqns[0]
    jaxpr = kernel.params["jaxpr"]
    x_hbm, _, _, pages, halves, _ = jaxpr.invars
    found = accessed_in_part(jaxpr)
    # (each sync_copy is a run_scoped of its own, allocating its semaphore)
    scoped = [e for e in jaxpr.eqns if e.primitive.name == "run_scoped"][-1]
    part, full = scoped.params["jaxpr"].invars
    # x_hbm: each DMA reads one slab of it. (Nested jaxprs' own variables are in the set
    # too: an allocation is known by its variable wherever it is made.)
    assert found & set(jaxpr.invars) == {x_hbm, pages, halves}
    assert part in found and full not in found
