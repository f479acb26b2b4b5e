"""Row blocks staged into a scratch through a reshape view; the loop stops half-way.

The kernel scales each (8, 128) row block of its input into the matching half of
`acc_ref` (16, 128), seen as `acc_ref.reshape(2, 8, 128).at[k]`, then reads `acc_ref`
whole. The block count is computed with the wrong block height (16 instead of 8), so
only the first half is ever written: the second half of the output is stale VMEM.
pallas-check tracks the view element by element and names exactly the unwritten half.

Expected finding: kind=uninitialized buffer=acc_ref range=[8:16, 0:128] line=27
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

ROWS = 16


def stage_kernel(x_ref, o_ref, acc_ref):
    halves = acc_ref.reshape(2, 8, 128)
    # BUG: blocks are 8 rows high; `ROWS // 16` visits only the first one.
    for k in range(ROWS // 16):
        halves.at[k][...] = x_ref[pl.ds(8 * k, 8), :] * (k + 1)
    # ... more work on the staged blocks would go here ...
    o_ref[...] = acc_ref[...] + 1.0


def stage(x):
    return pl.pallas_call(
        stage_kernel,
        out_shape=jax.ShapeDtypeStruct((ROWS, 128), x.dtype),
        scratch_shapes=[pltpu.VMEM((ROWS, 128), jnp.float32)],
    )(x)


if __name__ == "__main__":
    x = jnp.arange(ROWS * 128, dtype=jnp.float32).reshape(ROWS, 128)
    out = jax.jit(stage)(x)
    want = np.concatenate([x[:8], x[8:] * 2]) + 1
    print("reshape_view_bug: matches reference:", bool(np.allclose(out, want)))
