"""A semaphore wait that nothing will ever satisfy: on a TPU the kernel hangs.

The kernel waits for sems[1], which the author believed a DMA (or another core)
signals; nothing does. Only sems[0] is signalled. pallas-check finds that no actor can
run and reports a deadlock instead of hanging.

Expected finding: kind=deadlock buffer=sems range=[1] line=23
(range is the index of the semaphore waited on in the sems array)
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
    # BUG: nothing signals sems[1].
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
    print("deadlock_bug: out[0, :4] =", np.asarray(out)[0, :4])
