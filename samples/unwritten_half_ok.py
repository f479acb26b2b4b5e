"""Fixed unwritten_half_bug.py: both halves of the output block are written.

Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl


def halves_kernel(x_ref, y_ref, o_ref):
    o_ref[0:4, :] = x_ref[0:4, :] + y_ref[0:4, :]
    o_ref[4:8, :] = x_ref[4:8, :] - y_ref[4:8, :]


def halves(x, y):
    return pl.pallas_call(
        halves_kernel,
        grid=(1,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (0, 0))] * 2,
        out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((8, 128), x.dtype),
    )(x, y)


if __name__ == "__main__":
    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
    y = jnp.ones_like(x)
    out = jax.jit(halves)(x, y)
    np.testing.assert_allclose(out, jnp.concatenate([x[:4] + y[:4], x[4:] - y[4:]]))
    print("unwritten_half_ok: output matches")
