"""An output index_map that returns to a block after visiting another one.

Four grid steps accumulate into two output blocks with lambda i: (i % 2, 0), visiting
blocks 0, 1, 0, 1. A TPU writes an output block back when its index changes and never
reads it back in: at step 2 block 0 starts again from stale VMEM and its write-back
overwrites step 0's.

Expected finding: kind=output-revisited buffer=o_ref range=[0:8, 0:128] line=35
(the line is the out_specs index_map; step 2 is the first return to block 0)
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl


def pair_sum_kernel(x_ref, o_ref):
    i = pl.program_id(0)

    @pl.when(i < 2)
    def _():
        o_ref[...] = x_ref[...]

    @pl.when(i >= 2)
    def _():
        o_ref[...] += x_ref[...]


def pair_sum(x):
    return pl.pallas_call(
        pair_sum_kernel,
        grid=(4,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i % 2, 0)),  # BUG: 0, 1, 0, 1
        out_shape=jax.ShapeDtypeStruct((16, 128), x.dtype),
    )(x)


if __name__ == "__main__":
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    out = jax.jit(pair_sum)(x)
    print("output_revisited_bug: out[0, :4] =", np.asarray(out)[0, :4])
