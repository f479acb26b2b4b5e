"""Fixed deadlock_bug.py: sems[1] is signalled before it is waited on.

Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def wait_kernel(x_ref, o_ref, sems):
    pl.semaphore_signal(sems.at[0])
    pl.semaphore_wait(sems.at[0])
    o_ref[...] = x_ref[...] + 1.0
    pl.semaphore_signal(sems.at[1])
    pl.semaphore_wait(sems.at[1])


def waiter(x):
    return pl.pallas_call(
        wait_kernel,
        grid=(1,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.SemaphoreType.REGULAR((2,))],
    )(x)


if __name__ == "__main__":
    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
    out = jax.jit(waiter)(x)
    np.testing.assert_allclose(out, x + 1.0)
    print("deadlock_ok: output matches")
