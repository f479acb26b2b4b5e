"""Ragged copies on a REGULAR semaphore, some of them empty.

Each of 4 entries copies LENS[i] rows of x (read from SMEM at run time) into its own rows
of `buf`; entry 2 is padding and copies nothing. A DMA that moves no bytes signals nothing
(measured on a TPU v5e); one that moves data adds the chip's count: its byte count / 32 on
a v5e (measured), one on TPU v6+ (JAX's tests; not measured here). The kernel waits once per
copy that moves data (`pl.when(n > 0)`), for that copy's count, then writes buf out. (The
version that waited 1 per copy on every chip halted a v5e core: "Semaphore ... has a nonzero
value upon exit from a Mosaic kernel".)

Run: pallas-check run samples/zero_dma_regular_ok.py
Expected findings: none (also with --tpu v6e).
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
    v5 = jax.devices()[0].device_kind.startswith("TPU v5")
    for i in range(ENTRIES):
        @pl.when(lens_ref[i] > 0)  # an empty copy never signals: no wait for it
        def _wait():
            pl.semaphore_wait(sem, lens_ref[i] * 128 * 4 // 32 if v5 else 1)
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
    np.testing.assert_array_equal(np.asarray(out), reference(x))
    print("zero_dma_regular_ok: output matches")
