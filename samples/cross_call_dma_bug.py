"""A copy started in one pallas_call and waited in the next, one wait forgotten.

As cross_call_dma_ok.py: `copy_start` starts two DMAs (the two halves of x into `out`)
and returns the two DMA semaphores with the copies in flight; `copy_done` should wait for
both. It waits for the first half only, then reads all of `out`: on a TPU the second
half may not have landed yet (the scaled output holds whatever `out` held), and the DMA
is never waited by any call that holds its semaphore.

Expected finding: kind=dma-not-waited buffer=o_hbm range=[4:8, 0:128] line=33
Expected finding: kind=uninitialized buffer=buf range=[4:8, 0:128] line=43
Expected finding: kind=race buffer=o_hbm range=[4:8, 0:128] line=33 args=--races
(dma-not-waited and race: the DMA's destination, at the line of the first call that
started it; uninitialized: the second half read before it landed reaches y)
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

HALF = 4


def half_copy(x_hbm, o_hbm, sems, k):
    rows = pl.ds(k * HALF, HALF)
    return pltpu.make_async_copy(x_hbm.at[rows], o_hbm.at[rows], sems.at[k])


def start_kernel(x_hbm, x_alias, o_hbm, sems):
    del x_alias
    half_copy(x_hbm, o_hbm, sems, 0).start()
    half_copy(x_hbm, o_hbm, sems, 1).start()


def done_kernel(x_hbm, o_hbm, sems, o_alias, y_ref, buf, sem):
    del o_alias
    half_copy(x_hbm, o_hbm, sems, 0).wait()
    # BUG: no wait for the second half before reading all of o_hbm.
    copy = pltpu.make_async_copy(o_hbm, buf, sem)
    copy.start()
    copy.wait()
    y_ref[...] = buf[...] * 2.0 + 1.0


def copy_start(x):
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    return pl.pallas_call(
        start_kernel,
        in_specs=[any_spec],
        out_specs=(any_spec, any_spec, pl.BlockSpec(memory_space=pltpu.SEMAPHORE)),
        out_shape=(jax.ShapeDtypeStruct(x.shape, x.dtype),
                   jax.ShapeDtypeStruct(x.shape, x.dtype),
                   pltpu.SemaphoreType.DMA((2,))),
        input_output_aliases={0: 0},
    )(x)


def copy_done(x, out, sems):
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    return pl.pallas_call(
        done_kernel,
        in_specs=[any_spec, any_spec, pl.BlockSpec(memory_space=pltpu.SEMAPHORE)],
        out_specs=(any_spec, pl.BlockSpec(memory_space=pltpu.VMEM)),
        out_shape=(jax.ShapeDtypeStruct(x.shape, x.dtype),
                   jax.ShapeDtypeStruct(x.shape, x.dtype)),
        scratch_shapes=[pltpu.VMEM(x.shape, x.dtype), pltpu.SemaphoreType.DMA],
        input_output_aliases={1: 0},
    )(x, out, sems)


@jax.jit
def copy_and_scale(x):
    x, out, sems = copy_start(x)
    return copy_done(x, out, sems)


if __name__ == "__main__":
    x = jnp.arange(2 * HALF * 128, dtype=jnp.float32).reshape(2 * HALF, 128)
    out, y = copy_and_scale(x)
    ok = np.array_equal(np.asarray(y), np.asarray(x) * 2.0 + 1.0)
    print("cross_call_dma_bug: y matches reference:", ok)
