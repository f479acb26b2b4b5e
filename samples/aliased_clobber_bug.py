"""An in-place update through input_output_aliases that visits blocks it does not write.

The kernel adds 1 to the rows of x whose block is flagged, in place (x aliased to the
output), and relies on the alias to keep the other blocks. BUG: the grid visits every
block and the kernel writes only the flagged ones under pl.when. On a TPU an output block
is never read in from HBM: each visited block is written back whole, so the unflagged
blocks (rows 8:16 and 24:32) are overwritten with whatever VMEM held, not x's values.

Expected finding: kind=unwritten-output buffer=o_ref range=[8:32, 0:128] line=19
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def bump_kernel(flags_ref, x_ref, o_ref):
    @pl.when(flags_ref[pl.program_id(0)] == 1)
    def _():
        o_ref[...] = x_ref[...] + 1.0


def bump_flagged(flags, x):
    return pl.pallas_call(
        bump_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(x.shape[0] // 8,),  # BUG: every block visited
            in_specs=[pl.BlockSpec((8, 128), lambda i, f: (i, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i, f: (i, 0))),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        input_output_aliases={1: 0},
    )(flags, x)


if __name__ == "__main__":
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    flags = jnp.array([1, 0, 1, 0], jnp.int32)
    out = jax.jit(bump_flagged)(flags, x)
    want = np.asarray(x) + np.repeat(np.asarray(flags), 8)[:, None]
    print("aliased_clobber_bug: matches reference:", bool(np.allclose(out, want)))
