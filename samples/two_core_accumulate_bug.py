"""Two cores accumulating into one output block.

The grid is (2, K): axis 0 is marked "parallel", so a megacore TPU gives each of its two
TensorCores one half, and each core sums its K row blocks in its own VMEM copy of the
output block. But the output's index_map ignores axis 0: both cores hold the SAME output
block and both write it back to HBM when their half ends. Whichever lands last wins and
the other core's partial sum is lost.

For a megacore chip (v4, v5p: two TensorCores per device, `--cores 2`). A v5e, v6e or
v7x device has one TensorCore, which runs the whole grid: there the two halves never race.

Run: pallas-check run samples/two_core_accumulate_bug.py --tpu v5p --cores 2 --races
Expected finding: kind=race buffer=o_ref range=[0:8, 0:128] line=41 args=--tpu v5p --cores 2 --races
(line 41 is the output's index_map: the race is between the two cores' block write-backs)
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

K = 4  # row blocks per core


def partial_sum_kernel(x_ref, o_ref):
    @pl.when(pl.program_id(1) == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += x_ref[...]


def block_sum(x):
    return pl.pallas_call(
        partial_sum_kernel,
        grid=(2, K),
        in_specs=[pl.BlockSpec((8, 128), lambda c, k: (c * K + k, 0))],
        # BUG: the output block does not depend on c, so both cores accumulate into (and
        # write back) the same block; each core needs its own (see the _ok twin).
        out_specs=pl.BlockSpec((8, 128), lambda c, k: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
    )(x)


if __name__ == "__main__":
    x = jnp.arange(2 * K * 8 * 128, dtype=jnp.float32).reshape(2 * K * 8, 128) / 1024.0
    out = jax.jit(block_sum)(x)
    expected = x.reshape(2 * K, 8, 128).sum(axis=0)
    print("two_core_accumulate_bug: output",
          "matches" if np.allclose(out, expected) else "is wrong")
