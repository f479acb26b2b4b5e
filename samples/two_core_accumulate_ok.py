"""The fix of two_core_accumulate_bug.py: each core accumulates into its own output block
(the output gains a leading axis of size 2, indexed by the parallel axis), and the two
partial sums are added outside the kernel.

For a megacore chip (v4, v5p: two TensorCores per device, `--cores 2`); right on a
one-TensorCore device too.

Run: pallas-check run samples/two_core_accumulate_ok.py --tpu v5p --cores 2 --races
Expected findings: none.
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
    partials = pl.pallas_call(
        partial_sum_kernel,
        grid=(2, K),
        in_specs=[pl.BlockSpec((8, 128), lambda c, k: (c * K + k, 0))],
        out_specs=pl.BlockSpec((None, 8, 128), lambda c, k: (c, 0, 0)),
        out_shape=jax.ShapeDtypeStruct((2, 8, 128), jnp.float32),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
    )(x)
    return partials.sum(axis=0)


if __name__ == "__main__":
    x = jnp.arange(2 * K * 8 * 128, dtype=jnp.float32).reshape(2 * K * 8, 128) / 1024.0
    out = jax.jit(block_sum)(x)
    np.testing.assert_allclose(out, x.reshape(2 * K, 8, 128).sum(axis=0), rtol=1e-6)
    print("two_core_accumulate_ok: output matches")
