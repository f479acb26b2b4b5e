"""Waits whose descriptors are larger than the ragged copies they wait for: a hang.

As dynamic_dma_ok.py: entry i copies LENS[i] pages (6, 2, 0 and 8; the length read from
SMEM at run time). The wait loop builds each descriptor with the largest entry's size,
MAX_LEN = 8 pages, instead of the copy's own length. A DMA semaphore counts bytes and a
wait takes off the bytes of the descriptor it is given: the copies signal 16 pages of
bytes in all, the first two waits take 8 pages each, and the third waits for 8 pages'
bytes (32768) that nothing will ever signal: on a TPU the kernel hangs.

Expected finding: kind=deadlock buffer=sem_a line=40
(range omitted: sem_a is a single semaphore)
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

PAGES, ENTRIES = 32, 4
STARTS = np.array([0, 8, 16, 24], np.int32)
LENS = np.array([6, 2, 0, 8], np.int32)  # entry 2 is padding: nothing to copy
MAX_LEN = 8


def ragged_copy_kernel(starts_ref, lens_ref, x_hbm, o_ref, a, b, sem_a, sem_b):
    a[...] = jnp.zeros_like(a)
    b[...] = jnp.zeros_like(b)

    @pl.loop(0, ENTRIES)
    def _start(i):
        rows = pl.ds(starts_ref[i], lens_ref[i])
        pltpu.make_async_copy(x_hbm.at[rows], a.at[rows], sem_a).start()
        pltpu.make_async_copy(x_hbm.at[rows], b.at[rows], sem_b).start()

    @pl.loop(0, ENTRIES)
    def _wait_each(i):
        # BUG: waits with the largest entry's size, not the size its copy was started with.
        rows = pl.ds(starts_ref[i], MAX_LEN)
        pltpu.make_async_copy(x_hbm.at[rows], a.at[rows], sem_a).wait()

    total = lens_ref[0] + lens_ref[1] + lens_ref[2] + lens_ref[3]
    # One descriptor covering all of them: its bytes are the sum of theirs.
    pltpu.make_async_copy(x_hbm.at[pl.ds(0, total)], b.at[pl.ds(0, total)], sem_b).wait()
    o_ref[0] = a[...]
    o_ref[1] = b[...]


def ragged_copy(starts, lens, x):
    return pl.pallas_call(
        ragged_copy_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2, grid=(1,),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((2, PAGES, 8, 128), lambda i, *_: (0, 0, 0, 0)),
            scratch_shapes=[pltpu.VMEM((PAGES, 8, 128), jnp.float32),
                            pltpu.VMEM((PAGES, 8, 128), jnp.float32),
                            pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA]),
        out_shape=jax.ShapeDtypeStruct((2, PAGES, 8, 128), jnp.float32),
    )(starts, lens, x)


if __name__ == "__main__":
    x = jnp.arange(PAGES * 8 * 128, dtype=jnp.float32).reshape(PAGES, 8, 128) + 1
    out = np.asarray(jax.jit(ragged_copy)(STARTS, LENS, x))
    want = np.zeros((PAGES, 8, 128), np.float32)
    for start, n in zip(STARTS, LENS):
        want[start:start + n] = np.asarray(x)[start:start + n]
    print("dynamic_dma_bug: matches reference:", bool(np.array_equal(out[0], want)))
