"""index_map_multiple_of_bug.py fixed: the segments start at rows 0, 8, 16 and 24, each
offset still hinted `pl.multiple_of(.., 8)` in the index map; every block lies inside x.

Both block dimensions are `pl.Element`: Mosaic takes all or none of a block's dimensions as
Elements, and a v5e refused the sample's first version, an Element row dimension beside a
blocked one (session 30, `hardware/chip/v5e/session30_call1.jsonl`).

Run: pallas-check run samples/index_map_multiple_of_ok.py
Expected findings: none.
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
    starts = jnp.array([24, 0, 16, 8], dtype=jnp.int32)
    out = jax.jit(gather_segments)(starts, x)
    rows = np.concatenate([np.arange(s, s + 8) for s in np.asarray(starts)])
    np.testing.assert_allclose(out, 2.0 * np.asarray(x)[rows])
    print("index_map_multiple_of_ok: output matches")
