"""Fixed output_revisited_bug.py: each output block's visits are consecutive.

The input blocks are visited in the order 0, 2, 1, 3 (index_map j(i) below), so the
output index_map lambda i: (i // 2, 0) visits output blocks 0, 0, 1, 1 and each block
stays in VMEM while it accumulates. Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl


def pair_sum_kernel(x_ref, o_ref):
    i = pl.program_id(0)

    @pl.when(i % 2 == 0)
    def _():
        o_ref[...] = x_ref[...]

    @pl.when(i % 2 == 1)
    def _():
        o_ref[...] += x_ref[...]


def pair_sum(x):
    return pl.pallas_call(
        pair_sum_kernel,
        grid=(4,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: ((i % 2) * 2 + i // 2, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i // 2, 0)),
        out_shape=jax.ShapeDtypeStruct((16, 128), x.dtype),
    )(x)


if __name__ == "__main__":
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    out = jax.jit(pair_sum)(x)
    np.testing.assert_allclose(out, x[:16] + x[16:])
    print("output_revisited_ok: output matches")
