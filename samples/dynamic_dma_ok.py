"""Fixed dynamic_dma_bug.py: every wait is given the descriptor of the copy it waits for.

A ragged copy, as a paged KV cache or a grouped matmul makes it: entry i copies
LENS[i] pages of x, from page STARTS[i], with the length read from SMEM (scalar
prefetch) at run time; entry 2 is padding and copies nothing (a zero-length DMA moves
no bytes and signals none). A DMA semaphore counts bytes, so each wait must take off
exactly what its copy signalled:

- into a: one DMA per entry on sem_a, waited one by one in a second pl.loop with the
  same traced sizes (`pl.ds(start, n)`);
- into b: the same copies on sem_b, waited at once by one descriptor whose size is the
  sum of the lengths (the bytes of all of them).

Run: pallas-check run dynamic_dma_ok.py --dma random --schedules 20
Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

PAGES, ENTRIES = 32, 4
STARTS = np.array([0, 8, 16, 24], np.int32)
LENS = np.array([6, 2, 0, 8], np.int32)  # entry 2 is padding: nothing to copy


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
        rows = pl.ds(starts_ref[i], lens_ref[i])  # the same traced size as its start
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
    np.testing.assert_array_equal(out[0], want)
    np.testing.assert_array_equal(out[1], want)
    print("dynamic_dma_ok: output matches")
