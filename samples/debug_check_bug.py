"""A kernel's own assertion fails at one grid step: a ragged row sum given a bad length.

Each grid step sums the first `lens[i]` rows of its (8, 128) block; the kernel asserts
with pl.debug_check that a length fits the block. The caller splits 28 rows as
8, 8, 9, 3: step 2 is told 9 rows, one more than its block holds. On a TPU the check is
compiled out unless pl.enable_debug_checks() is on, and the mask (row < 9) quietly sums
8 rows; pallas-check evaluates every pl.debug_check, on or off.

Expected finding: kind=check-failed buffer= line=25
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

ROWS = 8


def ragged_sum_kernel(lens_ref, x_ref, o_ref):
    i = pl.program_id(0)
    n = lens_ref[i]
    # The author's assertion; BUG (the caller's): step 2 is given 9 rows.
    pl.debug_check(n <= ROWS, "a step's length must fit its block")
    rows = jax.lax.broadcasted_iota(jnp.int32, (ROWS, 128), 0)
    x = jnp.where(rows < n, x_ref[...], 0.0)
    o_ref[...] = jnp.broadcast_to(jnp.sum(x, axis=0, keepdims=True), (ROWS, 128))


def ragged_sum(lens, x):
    steps = x.shape[0] // ROWS
    return pl.pallas_call(
        ragged_sum_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(steps,),
            in_specs=[pl.BlockSpec((ROWS, 128), lambda i, lens: (i, 0))],
            out_specs=pl.BlockSpec((ROWS, 128), lambda i, lens: (i, 0))),
        out_shape=jax.ShapeDtypeStruct((steps * ROWS, 128), x.dtype),
    )(lens, x)


if __name__ == "__main__":
    x = jnp.ones((4 * ROWS, 128), jnp.float32)
    lens = jnp.array([8, 8, 9, 3], jnp.int32)  # BUG: 9 rows for an 8-row block
    out = jax.jit(ragged_sum)(lens, x)
    print("debug_check_bug: row sums", np.asarray(out)[::ROWS, 0])
