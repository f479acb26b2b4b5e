"""A double-buffered kernel reads its block before waiting for the DMA that brings it.

x stays in HBM. Step i computes on one half of a two-slot VMEM buffer while the DMA of
block i+1 fills the other half (double buffering). The bug: step i reads its half before
`wait()` on the DMA that fills it. Both halves were zeroed at step 0, so the read never
sees never-written memory: it sees zeros at steps 0 and 1, then the block of two steps
before (the slot's previous block), whenever the DMA has not landed yet (`--dma on_wait`:
at every step; on a TPU: it depends on timing). No uninitialized read, no out-of-bounds
access: only the race checker (on by default) sees that no wait orders the read after
the DMA's write. With `--no-races` this kernel reports nothing and its output is wrong.

Expected finding: kind=race buffer=buf range=[0, 0:8, 0:128] line=39
(line 39 starts the DMA of block 0 into slot 0, whose write races with step 0's read on
line 46; the default `--dma on_wait` lands it at the wait, after the read)
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCKS, ROWS = 4, 8


def fetch(x_hbm, buf, sems, block, slot):
    """The DMA of x's block `block` into `slot` of buf (its own semaphore per slot)."""
    rows = x_hbm.at[pl.ds(pl.multiple_of(block * ROWS, ROWS), ROWS)]
    return pltpu.make_async_copy(rows, buf.at[slot], sems.at[slot])


def double_kernel(x_hbm, o_ref, buf, sems):
    i = pl.program_id(0)
    slot = i % 2

    @pl.when(i == 0)
    def _():
        buf[...] = jnp.zeros(buf.shape, buf.dtype)
        fetch(x_hbm, buf, sems, 0, 0).start()

    @pl.when(i + 1 < BLOCKS)
    def _():
        fetch(x_hbm, buf, sems, i + 1, 1 - slot).start()  # prefetch the next block

    # BUG: the slot is read before the wait below: its DMA may not have landed.
    y = buf[slot] * 2.0
    fetch(x_hbm, buf, sems, i, slot).wait()
    o_ref[...] = y


def double(x):
    return pl.pallas_call(
        double_kernel,
        grid=(BLOCKS,),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((ROWS, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM((2, ROWS, 128), jnp.float32),
                        pltpu.SemaphoreType.DMA((2,))],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
    )(x)


if __name__ == "__main__":
    x = jnp.arange(BLOCKS * ROWS * 128, dtype=jnp.float32).reshape(BLOCKS * ROWS, 128)
    out = jax.jit(double)(x)
    print("stale_prefetch_bug: matches reference:", bool(np.allclose(out, 2.0 * x)))
