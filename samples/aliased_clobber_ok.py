"""aliased_clobber_bug.py fixed: the grid visits only the flagged blocks.

The scalar-prefetched list of flagged block indices drives both index maps, so every
block the pipeline writes back is one the kernel wrote; the blocks never visited keep
x's values through the alias.

Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def bump_kernel(blocks_ref, x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1.0


def bump_flagged(blocks, x):
    return pl.pallas_call(
        bump_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(blocks.shape[0],),
            in_specs=[pl.BlockSpec((8, 128), lambda i, b: (b[i], 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i, b: (b[i], 0))),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        input_output_aliases={1: 0},
    )(blocks, x)


if __name__ == "__main__":
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    flags = np.array([1, 0, 1, 0])
    blocks = jnp.asarray(np.nonzero(flags)[0], jnp.int32)
    out = jax.jit(bump_flagged)(blocks, x)
    np.testing.assert_allclose(out, np.asarray(x) + np.repeat(flags, 8)[:, None])
    print("aliased_clobber_ok: output matches")
