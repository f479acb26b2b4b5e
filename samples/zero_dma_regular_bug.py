"""Ragged copies on a REGULAR semaphore: the padding entry is skipped twice.

As zero_dma_regular_ok.py: 4 entries copy LENS[i] rows each, entry 2 (padding) copies
nothing and so signals nothing. The waits skip the empty copy with `pl.when(n > 0)` AND
loop over one entry fewer "for the padding": entry 3's copy (buf rows 24..29) is never
waited, and the copy out may read those rows before they land.

Run: pallas-check run samples/zero_dma_regular_bug.py --tpu v6e
Expected finding: kind=dma-not-waited buffer=buf range=[24:29, 0:128] line=28 args=--tpu v6e
(buffer and range are the DMA's destination; the empty copy of entry 2 is no finding)
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

ENTRIES, ROWS = 4, 8
STARTS = np.array([0, 8, 16, 24], np.int32)
LENS = np.array([8, 3, 0, 5], np.int32)  # entry 2 is padding: nothing to copy


def ragged_kernel(starts_ref, lens_ref, x_hbm, o_hbm, buf, sem):
    buf[...] = jnp.zeros_like(buf)
    for i in range(ENTRIES):
        rows = pl.ds(starts_ref[i], lens_ref[i])
        pltpu.async_copy(x_hbm.at[rows], buf.at[rows], sem)
    for i in range(ENTRIES - 1):  # BUG: "one wait fewer for the padding" skips entry 3
        @pl.when(lens_ref[i] > 0)  # an empty copy never signals: no wait for it
        def _wait():
            pl.semaphore_wait(sem, 1)
    pltpu.sync_copy(buf, o_hbm)


def ragged_copy(starts, lens, x):
    return pl.pallas_call(
        ragged_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2, grid=(1,),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.VMEM((ENTRIES * ROWS, 128), jnp.float32),
                            pltpu.SemaphoreType.REGULAR]),
        out_shape=jax.ShapeDtypeStruct((ENTRIES * ROWS, 128), jnp.float32),
    )(starts, lens, x)


def reference(x):
    want = np.zeros_like(x)
    for start, n in zip(STARTS, LENS):
        want[start:start + n] = x[start:start + n]
    return want


if __name__ == "__main__":
    x = np.arange(ENTRIES * ROWS * 128, dtype=np.float32).reshape(-1, 128) + 1
    out = jax.jit(ragged_copy)(jnp.asarray(STARTS), jnp.asarray(LENS), jnp.asarray(x))
    print("zero_dma_regular_bug: matches reference:",
          np.array_equal(np.asarray(out), reference(x)))
