"""A broadcast load: row 0 of each scale block, read 8 times with a stride of 0
(`pl.ds(0, 8, stride=0)`), scales 8 rows of x.

Run: pallas-check run samples/zero_stride_ok.py
Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl


def scale_kernel(x_ref, s_ref, o_ref):
    scale = s_ref[:, pl.ds(0, 8, stride=0), :]  # (2, 8, 128): s_ref[:, 0, :] eight times
    o_ref[...] = x_ref[...] * scale


def scale_rows(x, s):
    return pl.pallas_call(
        scale_kernel, grid=(x.shape[0] // 2,),
        in_specs=[pl.BlockSpec((2, 8, 128), lambda i: (i, 0, 0)),
                  pl.BlockSpec((2, 4, 128), lambda i: (i, 0, 0))],
        out_specs=pl.BlockSpec((2, 8, 128), lambda i: (i, 0, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x, s)


if __name__ == "__main__":
    x = jnp.arange(4 * 8 * 128, dtype=jnp.float32).reshape(4, 8, 128)
    s = jnp.arange(4 * 4 * 128, dtype=jnp.float32).reshape(4, 4, 128) / 100
    np.testing.assert_allclose(jax.jit(scale_rows)(x, s), x * s[:, :1, :], rtol=1e-6)
    print("zero_stride_ok: output matches")
