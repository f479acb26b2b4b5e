"""A lane slice whose alignment Mosaic cannot prove: `pl.ds(i * 64, 128)`.

Each grid step copies a window of 128 lanes out of a (8, 512) block, the windows half a
window apart. A dynamic lane offset must be a provable multiple of 128 on a TPU; `i * 64`
is not, so Mosaic refuses the load (E2003). The simulation computes it fine; `--compile`
reports the load's line and the ref it reads.

Expected finding: kind=compile-error buffer=x_ref line=21 generation=v7x args=--compile --tpu v7x
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

STEP = 64  # BUG: window starts half a lane tile apart


def window_kernel(x_ref, o_ref):
    i = pl.program_id(0)
    o_ref[...] = x_ref[:, pl.ds(i * STEP, 128)]


def windows(x, count):
    return pl.pallas_call(
        window_kernel,
        grid=(count,),
        in_specs=[pl.BlockSpec(x.shape, lambda i: (0, 0))],
        out_specs=pl.BlockSpec((x.shape[0], 128), lambda i: (0, i)),
        out_shape=jax.ShapeDtypeStruct((x.shape[0], 128 * count), x.dtype),
    )(x)


if __name__ == "__main__":
    x = jnp.arange(8 * 512, dtype=jnp.float32).reshape(8, 512)
    expected = jnp.concatenate([x[:, i * STEP:i * STEP + 128] for i in range(3)], axis=1)
    np.testing.assert_allclose(jax.jit(windows, static_argnums=1)(x, 3), expected)
    print("compile_alignment_bug: output matches")
