"""A semaphore that is signalled and never waited on.

The kernel signals sems[1] to announce "block ready" to a consumer that was never
written (only sems[0] has a matching wait). The kernel ends with sems[1] at count 1;
on a TPU a semaphore left non-zero at kernel exit is an error (and the next kernel
using that semaphore sees a stale count).

Expected finding: kind=semaphore-leak buffer=sems range=[1] line=24
(range is the index of the leaked semaphore in the sems array)
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
    # BUG: nobody waits for this signal.
    pl.semaphore_signal(sems.at[1])


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
    print("semaphore_leak_bug: out[0, :4] =", np.asarray(out)[0, :4])
