"""An in-place "shift by one block" that overwrites a block the pipeline is prefetching.

`x` is read block by block through its BlockSpec and is aliased to the output, which the
kernel writes with its own DMA (memory_space=pl.ANY): step i copies block i of x into
block i+1 of the same HBM array. On a TPU the BlockSpec pipeline starts fetching block i+1
*before* body i runs (double buffering), so that fetch and this step's DMA write race:
the next step sees either the old block or the one just written. Walking the blocks
backwards (samples/prefetch_overwrite_ok.py) writes only blocks already fetched.

Run: pallas-check run samples/prefetch_overwrite_bug.py --races
Expected finding: kind=race buffer=x_ref range=[8:16, 0:128] line=39 args=--races
(line 39 is x's BlockSpec index_map: the pipeline's copy-in of x_ref block (1, 0) reads
what the DMA started on line 31 writes during step 0)
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCKS, ROWS = 8, 8


def shift_kernel(x_ref, o_hbm, sem):
    i = pl.program_id(0)

    @pl.when(i + 1 < BLOCKS)
    def _():
        copy = pltpu.make_async_copy(x_ref, o_hbm.at[pl.ds((i + 1) * ROWS, ROWS)], sem)
        copy.start()
        copy.wait()


def shift_in_place(x):
    return pl.pallas_call(
        shift_kernel,
        grid=(BLOCKS,),
        in_specs=[pl.BlockSpec((ROWS, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.SemaphoreType.DMA],
        input_output_aliases={0: 0},
    )(x)


if __name__ == "__main__":
    x = jnp.arange(BLOCKS * ROWS * 128, dtype=jnp.float32).reshape(BLOCKS * ROWS, 128)
    expected = np.concatenate([np.asarray(x[:ROWS]), np.asarray(x[:-ROWS])])
    out = jax.jit(shift_in_place)(x)
    print("prefetch_overwrite_bug: output", "matches" if np.allclose(out, expected)
          else "is wrong")
