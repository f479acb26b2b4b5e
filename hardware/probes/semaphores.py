"""Probe: what a DMA adds to the semaphore it signals, per semaphore type and size, and
what an empty DMA (zero rows) adds.

Each case starts DMAs, then spins on `pl.semaphore_read` until the value is non-zero (or a
bound of reads passes), waits a fixed delay so every DMA has landed, reads again and keeps
the readings in SMEM. It then takes the count off again (a DMA semaphore by the copy's
`.wait()`, a regular one by `pl.semaphore_wait(sem, value)`) so the kernel exits with every
semaphore at zero -- a non-zero semaphore at a kernel's exit halts a TPU core.

Usage: python semaphores.py CASE...   (each risky case in a process of its own)
"""

from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from common import Results, call, main_guard

SPIN = 1 << 20
SETTLE_NS = 200_000  # 0.2 ms: far longer than any of these copies takes


def spin(sem):
    """Reads until non-zero or SPIN reads; then the value once everything has landed."""
    def cond(c):
        i, v = c
        return jnp.logical_and(v == 0, i < SPIN)

    def body(c):
        i, _ = c
        return i + 1, pl.semaphore_read(sem)
    i, first = lax.while_loop(cond, body, (jnp.int32(0), pl.semaphore_read(sem)))
    pl.delay(SETTLE_NS)
    return i, first, pl.semaphore_read(sem)


def dma_case(rows: int, dtype, regular: bool, n_dmas: int = 1, dynamic_rows: bool = False):
    """DMAs of `rows` rows of a (16, 128) `dtype` array into VMEM, signalling one
    semaphore (a DMA semaphore, or a REGULAR one); readings kept in SMEM."""
    x = (np.arange(16 * 128 * n_dmas) % 251).astype(dtype).reshape(16 * n_dmas, 128)

    def kernel(n_ref, x_hbm, o_ref, buf, sem):
        n = n_ref[0] if dynamic_rows else rows
        copies = [pltpu.make_async_copy(x_hbm.at[pl.ds(16 * k, n)],
                                        buf.at[pl.ds(16 * k, n)], sem)
                  for k in range(n_dmas)]
        for c in copies:
            c.start()
        i, first, settled = spin(sem)
        o_ref[0] = i
        o_ref[1] = first
        o_ref[2] = settled
        if regular:
            @pl.when(settled > 0)
            def _():
                pl.semaphore_wait(sem, settled)
        else:
            @pl.when(settled > 0)
            def _():
                for c in copies:
                    c.wait()
        o_ref[3] = pl.semaphore_read(sem)

    sem_type = pltpu.SemaphoreType.REGULAR if regular else pltpu.SemaphoreType.DMA
    return call(kernel,
                grid_spec=pltpu.PrefetchScalarGridSpec(
                    num_scalar_prefetch=1, grid=(1,),
                    in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                    out_specs=pl.BlockSpec(memory_space=pltpu.SMEM),
                    scratch_shapes=[pltpu.VMEM(x.shape, x.dtype), sem_type]),
                out_shape=jax.ShapeDtypeStruct((4,), jnp.int32),
                )(jnp.array([rows], jnp.int32), x)


CASES = {
    # DMA semaphores: what one landed copy adds (bytes? something else?)
    "dma_sem.f32_8rows": functools.partial(dma_case, 8, np.float32, False),
    "dma_sem.f32_16rows": functools.partial(dma_case, 16, np.float32, False),
    "dma_sem.bf16_16rows": functools.partial(dma_case, 16, jnp.bfloat16, False),
    "dma_sem.f32_3rows": functools.partial(dma_case, 3, np.float32, False),
    "dma_sem.f32_8rows_x2": functools.partial(dma_case, 8, np.float32, False, 2),
    "dma_sem.f32_5rows_dyn": functools.partial(dma_case, 5, np.float32, False, 1, True),
    # REGULAR semaphores signalled by a DMA
    "regular.f32_8rows": functools.partial(dma_case, 8, np.float32, True),
    "regular.f32_16rows": functools.partial(dma_case, 16, np.float32, True),
    "regular.f32_8rows_x2": functools.partial(dma_case, 8, np.float32, True, 2),
    "regular.f32_3rows_dyn": functools.partial(dma_case, 3, np.float32, True, 1, True),
    # empty copies (0 rows, the size read at run time)
    "regular.empty": functools.partial(dma_case, 0, np.float32, True, 1, True),
    "dma_sem.empty": functools.partial(dma_case, 0, np.float32, False, 1, True),
}


def run(r: Results, names) -> None:
    for name in names:
        r.case(name, CASES[name])


if __name__ == "__main__":
    names = sys.argv[1:] or list(CASES)
    tag = sys.argv[1].replace(".", "_") if len(sys.argv) == 2 else "all"
    main_guard(lambda r: run(r, names), f"semaphores_{tag}")
