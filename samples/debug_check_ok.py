"""Fixed debug_check_bug.py: the caller's lengths fit the blocks, so the kernel's own
assertion (pl.debug_check) holds at every grid step and is silent.

Each step writes its row sums to every row of its (8, 128) output block: a (1, 128) block
of a (4, 128) array breaks the 8 x 128 rule, and a v5e refused the sample's first version
(session 30, `hardware/chip/v5e/session30_call1.jsonl`).

Run: pallas-check run samples/debug_check_ok.py
Expected findings: none.
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
    x = jnp.arange(4 * ROWS * 128, dtype=jnp.float32).reshape(4 * ROWS, 128) % 7
    lens = np.array([8, 8, 8, 4], np.int32)
    out = jax.jit(ragged_sum)(jnp.asarray(lens), x)
    blocks = np.asarray(x).reshape(4, ROWS, 128)
    mask = np.arange(ROWS)[None, :, None] < lens[:, None, None]
    np.testing.assert_allclose(out[::ROWS], np.where(mask, blocks, 0.0).sum(axis=1))
    print("debug_check_ok: output matches")
