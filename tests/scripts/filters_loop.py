"""Two kernels called in a jitted loop, for the --kernel / --calls tests.

Usage: filters_loop.py STEPS OUT.npy -- runs STEPS steps of `step` and saves the final
state to OUT.npy. With FILTERS_LOOP_INTERPRET=1 the calls run under JAX's own HLO
interpreter (the unchecked reference the tests compare outputs with).

`scale_kernel` is correct (a BlockSpec grid, no DMA or semaphore: a call passed through
runs as XLA). `leak_kernel` has a bug in every call that leaves its outputs right: it
signals a semaphore that nothing waits on (a `semaphore-leak` finding at the signal's
line; a call passed through runs on the engine with its checks off).
"""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

INTERPRET = os.environ.get("FILTERS_LOOP_INTERPRET") == "1"


def scale_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 0.5 + 1.0


def scale(x):
    return pl.pallas_call(
        scale_kernel, interpret=INTERPRET, grid=(x.shape[0] // 8,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)


def leak_kernel(x_ref, o_ref, sem):
    o_ref[...] = x_ref[...] + 0.25
    pl.semaphore_signal(sem, 1)  # BUG: signalled, never waited: left with a count


def leak(x):
    return pl.pallas_call(
        leak_kernel, interpret=INTERPRET,
        in_specs=[pl.BlockSpec(memory_space=pltpu.VMEM)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.SemaphoreType.REGULAR],
    )(x)


@jax.jit
def step(x):
    return leak(scale(x))


def main() -> None:
    steps, out = int(sys.argv[1]), sys.argv[2]
    x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128) / 100
    for _ in range(steps):
        x = step(x)
    np.save(out, np.asarray(x))
    print(f"filters_loop: {steps} steps")


if __name__ == "__main__":
    main()
