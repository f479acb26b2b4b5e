"""A kernel writes only the top half of its output block.

The author meant to write both halves (rows 0..4 from x, rows 4..8 from y) but only
the first store is there. Rows 4..8 of the output are never written by anyone; on a
TPU they hold stale VMEM.

Expected finding: kind=unwritten-output buffer=o_ref range=[4:8, 0:128] line=17
(an unwritten element has no statement of its own: the line is the kernel's `def`)
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl


def top_half_kernel(x_ref, y_ref, o_ref):
    o_ref[0:4, :] = x_ref[0:4, :] + y_ref[0:4, :]
    # BUG: missing  o_ref[4:8, :] = x_ref[4:8, :] - y_ref[4:8, :]


def halves(x, y):
    return pl.pallas_call(
        top_half_kernel,
        grid=(1,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (0, 0))] * 2,
        out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((8, 128), x.dtype),
    )(x, y)


if __name__ == "__main__":
    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
    out = jax.jit(halves)(x, x)
    print("unwritten_half_bug: out[7, :4] =", np.asarray(out)[7, :4])
