"""What a DMA adds to the semaphore it signals, per TPU generation, as the chip counts it.

Measured on a TPU v5e (libtpu 0.0.42, `hardware/probes/semaphores.py`, results in
`hardware/README.md`): a landed DMA adds its byte count divided by 32 to a DMA semaphore
(4096 bytes: 128; 1536 bytes: 48; two DMAs of 4096 bytes: 256), and exactly the same to a
REGULAR semaphore it signals -- not one per DMA. A DMA that moves no bytes adds nothing to
either type. A kernel that waits a regular semaphore once per DMA (`pl.semaphore_wait(sem,
1)`) therefore leaves a count behind, and the chip halts the core at the kernel's exit
("Semaphore ... has a nonzero value upon exit from a Mosaic kernel", E0200; seen on
`samples/zero_dma_regular_ok.py` before it was corrected).

The engine keeps a DMA semaphore's count in bytes (a DMA wait takes off its descriptor's
bytes, the same ratio); what a kernel reads of it (`pl.semaphore_read`) is the chip's unit.
A regular semaphore's count is the chip's own number. What a kernel reads of a DMA
semaphore on v6e/v7x stays bytes (not measured).

v5p: not measured; modelled as the v5e (the same generation's DMA engine) -- unverified.
v6e, v7x: not measured here; one count per DMA on a regular semaphore, the behaviour JAX's
own tests rely on for "TPU v6+" -- unverified on a chip.
"""

from __future__ import annotations

import jax.numpy as jnp

from pallas_check.config import TpuGeneration
from pallas_check.jaxbridge.jaxprs import barrier_semaphore_dtype, regular_semaphore_dtype

COUNT_BYTES = 32  # a v5e DMA semaphore counts a DMA's bytes in units of 32


def counts_bytes_on_regular(tpu: TpuGeneration) -> bool:
    """Whether a DMA adds its (32-byte) count to a regular semaphore on this generation,
    rather than one."""
    return tpu in (TpuGeneration.V5E, TpuGeneration.V5P)


def regular_signal(nbytes: int, tpu: TpuGeneration) -> int:
    """What a DMA of `nbytes` adds to a REGULAR semaphore it signals (and what a DMA wait
    on that semaphore takes off): 0 for an empty DMA on every generation (measured on v5e),
    the 32-byte count on v5e/v5p, one on v6e/v7x."""
    if nbytes == 0:
        return 0
    if counts_bytes_on_regular(tpu):
        return -(-nbytes // COUNT_BYTES)
    return 1


def read_dma_semaphore(nbytes: int, tpu: TpuGeneration) -> int:
    """A DMA semaphore's count as a kernel reads it, from the bytes the engine keeps: the
    32-byte count on v5e/v5p; bytes on v6e/v7x (not measured: unverified)."""
    return nbytes // COUNT_BYTES if counts_bytes_on_regular(tpu) else nbytes


def is_regular(aval: object) -> bool:
    """Whether a semaphore ref's type counts signals (regular, barrier), not bytes."""
    dtype = getattr(aval, "dtype", None)
    try:
        return dtype is not None and (jnp.issubdtype(dtype, regular_semaphore_dtype)
                                      or jnp.issubdtype(dtype, barrier_semaphore_dtype))
    except TypeError:
        return False
