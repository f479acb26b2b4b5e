"""compile_block_shape_bug.py fixed: (8, 128) blocks, whole f32 tiles.

Run: pallas-check run samples/compile_block_shape_ok.py --compile --tpu v5e,v6e,v7x
Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl


def scale_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0


def scale(x):
    rows = 8
    return pl.pallas_call(
        scale_kernel,
        grid=(x.shape[0] // rows,),
        in_specs=[pl.BlockSpec((rows, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((rows, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)


if __name__ == "__main__":
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    np.testing.assert_allclose(jax.jit(scale)(x), x * 2.0)
    print("compile_block_shape_ok: output matches")
