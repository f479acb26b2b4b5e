"""Fixed stale_prefetch_bug.py: each step waits for its slot's DMA before reading it.

The DMA of block i+1 into the other slot still overlaps step i's work (the point of
double buffering); only the read of this step's slot moved after its wait.

Expected findings: none (under every --dma mode).
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

    fetch(x_hbm, buf, sems, i, slot).wait()
    o_ref[...] = buf[slot] * 2.0


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
    np.testing.assert_allclose(out, 2.0 * x)
    print("stale_prefetch_ok: output matches")
