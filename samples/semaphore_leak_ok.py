"""Fixed semaphore_leak_bug.py: every signal has its wait; all semaphores end at zero.

Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def handshake_kernel(x_ref, o_ref, sems):
    o_ref[...] = x_ref[...] * 3.0
    pl.semaphore_signal(sems.at[0])
    pl.semaphore_wait(sems.at[0])
    pl.semaphore_signal(sems.at[1])
    pl.semaphore_wait(sems.at[1])


def handshake(x):
    return pl.pallas_call(
        handshake_kernel,
        grid=(1,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.SemaphoreType.REGULAR((2,))],
    )(x)


if __name__ == "__main__":
    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
    out = jax.jit(handshake)(x)
    np.testing.assert_allclose(out, x * 3.0)
    print("semaphore_leak_ok: output matches")
