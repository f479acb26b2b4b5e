"""An in-place "shift by one block" done right: walk the blocks backwards.

The fix of prefetch_overwrite_bug.py. Step i handles block j = BLOCKS-1-i and writes block
j+1, which the pipeline fetched (and the kernel consumed) one step earlier; the block being
prefetched meanwhile is j-1, which nothing writes. The pipeline's copies and the kernel's
DMAs touch disjoint blocks whenever they could overlap in time.

Run: pallas-check run samples/prefetch_overwrite_ok.py --races
Expected findings: none (also under --dma eager and --dma random --schedules 20).
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCKS, ROWS = 8, 8


def shift_kernel(x_ref, o_hbm, sem):
    j = BLOCKS - 1 - pl.program_id(0)  # the block this step holds in x_ref

    @pl.when(j + 1 < BLOCKS)
    def _():
        copy = pltpu.make_async_copy(x_ref, o_hbm.at[pl.ds((j + 1) * ROWS, ROWS)], sem)
        copy.start()
        copy.wait()


def shift_in_place(x):
    return pl.pallas_call(
        shift_kernel,
        grid=(BLOCKS,),
        in_specs=[pl.BlockSpec((ROWS, 128), lambda i: (BLOCKS - 1 - i, 0))],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.SemaphoreType.DMA],
        input_output_aliases={0: 0},
    )(x)


if __name__ == "__main__":
    x = jnp.arange(BLOCKS * ROWS * 128, dtype=jnp.float32).reshape(BLOCKS * ROWS, 128)
    expected = np.concatenate([np.asarray(x[:ROWS]), np.asarray(x[:-ROWS])])
    out = jax.jit(shift_in_place)(x)
    print("prefetch_overwrite_ok: output", "matches" if np.allclose(out, expected)
          else "is wrong")
