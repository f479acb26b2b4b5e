"""A broadcast load that reads past its block: at grid step 1, `pl.ds(i + 2, 8, stride=0)`
wants row 3 of the scale block, but the BlockSpec brings only rows 0:3 of scale into VMEM.

Run: pallas-check run samples/zero_stride_bug.py
Expected finding: kind=out-of-bounds buffer=s_ref range=[0:2, 3, 0:128] line=17
(line 17 is the stride-0 load; the block of s_ref is (2, 3, 128))
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl


def scale_kernel(x_ref, s_ref, o_ref):
    row = pl.program_id(0) + 2  # bug: row 3 at step 1 is outside the (2, 3, 128) block
    scale = s_ref[:, pl.ds(row, 8, stride=0), :]
    o_ref[...] = x_ref[...] * scale


def scale_rows(x, s):
    return pl.pallas_call(
        scale_kernel, grid=(2,),
        in_specs=[pl.BlockSpec((2, 8, 128), lambda i: (i, 0, 0)),
                  pl.BlockSpec((2, 3, 128), lambda i: (i, 0, 0))],
        out_specs=pl.BlockSpec((2, 8, 128), lambda i: (i, 0, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x, s)


if __name__ == "__main__":
    x = jnp.arange(4 * 8 * 128, dtype=jnp.float32).reshape(4, 8, 128)
    s = jnp.arange(4 * 3 * 128, dtype=jnp.float32).reshape(4, 3, 128) / 100
    out = jax.jit(scale_rows)(x, s)
    print("zero_stride_bug: output has", int(np.isnan(np.asarray(out)).sum()), "NaNs")
