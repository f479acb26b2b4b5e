"""A grid that never reaches the last output block.

The grid is off by one: `n - 1` steps for `n` output blocks, so output rows 24..32
are never written by any grid step (on a TPU they keep whatever HBM held).

Expected finding: kind=unwritten-output buffer=o_ref range=[24:32, 0:128] line=16
(an unwritten element has no statement of its own: the line is the kernel's `def`)
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl


def double_kernel(x_ref, o_ref):
    o_ref[...] = 2.0 * x_ref[...]


def double(x):
    n_blocks = x.shape[0] // 8
    return pl.pallas_call(
        double_kernel,
        grid=(n_blocks - 1,),  # BUG: should be n_blocks
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)


if __name__ == "__main__":
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    out = jax.jit(double)(x)
    print("unwritten_grid_bug: out[-1, :4] =", np.asarray(out)[-1, :4])
