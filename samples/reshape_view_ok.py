"""Fixed reshape_view_bug.py: the loop visits every 8-row block, so both halves of the
scratch are written through the reshape view before it is read whole.
Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

ROWS = 16


def stage_kernel(x_ref, o_ref, acc_ref):
    halves = acc_ref.reshape(2, 8, 128)
    for k in range(ROWS // 8):
        halves.at[k][...] = x_ref[pl.ds(8 * k, 8), :] * (k + 1)
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
    np.testing.assert_allclose(out, jnp.concatenate([x[:8], x[8:] * 2]) + 1)
    print("reshape_view_ok: output matches")
