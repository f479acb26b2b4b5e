"""Rows gathered at scalar-prefetched offsets, each hinted `pl.multiple_of(.., 8)` in the
index map; one offset runs past the array.

Segment i of the output is the 8 rows of x that start at row starts[i] (a `pl.Element`
block, its offset a scalar-prefetch value the index map marks as a multiple of 8, as
kernels do to let Mosaic emit aligned copies). The caller shifts every segment by one
block to skip a header, and the last one starts at row 32 of a 32-row x: rows 32..40
lie outside the array.

Expected finding: kind=out-of-bounds buffer=x_ref range=[32:40, 0:128] line=31
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def copy_kernel(starts_ref, x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0


def gather_segments(starts, x):
    n = starts.shape[0]
    return pl.pallas_call(
        copy_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(n,),
            in_specs=[pl.BlockSpec((pl.Element(8), pl.Element(128)),
                                   lambda i, s: (pl.multiple_of(s[i], 8), 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i, s: (i, 0))),
        out_shape=jax.ShapeDtypeStruct((8 * n, 128), x.dtype),
    )(starts, x)


if __name__ == "__main__":
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    starts = jnp.arange(4, dtype=jnp.int32) * 8 + 8  # BUG: the last segment starts at row 32
    out = jax.jit(gather_segments)(starts, x)
    print("index_map_multiple_of_bug: out[0, :4] =", np.asarray(out)[0, :4])
