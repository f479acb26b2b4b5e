"""A copy started in one pallas_call and waited in the next (JAX's async-copy pattern).

`copy_start` starts two DMAs, the two halves of x into `out`, and returns `out` with the
two DMA semaphores (an out_shape of `pltpu.SemaphoreType.DMA((2,))`, its BlockSpec in
`pltpu.SEMAPHORE`) while the copies are still in flight; `copy_done` takes `out` (aliased
to its output) and the semaphores and waits for both copies before it scales the data.
XLA can run other work between the two calls, overlapping it with the copies.

The program runs on a TPU v5e (libtpu 0.0.42.1: its output matches the reference). The
first call compiled alone, with the semaphores as its program's results, aborts libtpu's
compiler ("Check failed: source->memory_space() == MemorySpace::kVmem ... memory_space=
sflag", on the v5e too: what `diff --native`, which re-runs each call alone, met); the
chip's compile of a run leaves them out of that call's compile and does not compile the
second call alone (docs/compile.md), so a default run is clean.

Run: pallas-check run cross_call_dma_ok.py --races
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
    half_copy(x_hbm, o_hbm, sems, 1).wait()
    copy = pltpu.make_async_copy(o_hbm, buf, sem)  # both halves have landed: read them
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
    ref = np.asarray(x)
    np.testing.assert_array_equal(np.asarray(out), ref)
    np.testing.assert_array_equal(np.asarray(y), ref * 2.0 + 1.0)
    print("cross_call_dma_ok: output matches the numpy reference")
