"""Fixed oob_load_bug.py: the block is indexed with block-local rows (pl.ds(0, 8)).

The BlockSpec already moved this step's rows into x_ref, so the offset inside the block
is 0. Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl


def scale_kernel(x_ref, o_ref):
    x = x_ref[pl.ds(0, 8), :]
    o_ref[...] = 2.0 * x


def scale(x):
    return pl.pallas_call(
        scale_kernel,
        grid=(x.shape[0] // 8,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)


if __name__ == "__main__":
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    out = jax.jit(scale)(x)
    np.testing.assert_allclose(out, 2.0 * x)
    print("oob_load_ok: output matches")
