"""A kernel indexes its input *block* with a global row offset (pl.ds past the block).

Each grid step gets an (8, 128) block of x, but the kernel reads
x_ref[pl.ds(i * 8, 8)] as if x_ref were the whole array. Step 0 reads rows 0..8 of
the block (fine); step 1 reads rows 8..16, past the block's end (on a TPU, whatever
lies after the block in VMEM). The first out-of-bounds step is i=1.

Expected finding: kind=out-of-bounds buffer=x_ref range=[8:16, 0:128] line=21
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl


def scale_kernel(x_ref, o_ref):
    i = pl.program_id(0)
    row = pl.multiple_of(i * 8, 8)
    # BUG: x_ref is only this step's (8, 128) block; the global offset overshoots it.
    x = x_ref[pl.ds(row, 8), :]
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
    print("oob_load_bug: last row", np.asarray(out)[-1, :4])
