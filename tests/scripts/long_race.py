"""A long racy call, to stop in the middle (tests/cli/test_stopping.py).

Every grid step starts a DMA into a VMEM scratch buffer and reads the buffer before
waiting for the DMA: a race at every step (`--races`). At grid step 2 (steps 0 and 1 done)
a debug callback prints "running": a test waits for it, not for a time, before stopping.

Usage: long_race.py [STEPS]  (default 50 000: about half a minute of simulation)
"""

import sys

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000


def say_running():
    print("running", flush=True)


def racy_kernel(x_hbm, o_ref, buf, sem):
    copy = pltpu.make_async_copy(x_hbm, buf, sem)
    copy.start()
    o_ref[...] = buf[...] * 2.0  # BUG: read before the wait
    copy.wait()

    @pl.when(pl.program_id(0) == 2)
    def _():
        jax.debug.callback(say_running)


def racy(x):
    return pl.pallas_call(
        racy_kernel, grid=(STEPS,),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA],
    )(x)


if __name__ == "__main__":
    out = jax.jit(racy)(jnp.ones((8, 128), jnp.float32))
    print("long_race: finished", float(out[0, 0]))
