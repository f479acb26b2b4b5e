"""Swapping uint32 halves through a bitcast view: the second copy lands in the wrong slot.

As dma_bitcast_bits_ok.py: the halves of a (16, 128) uint32 array swap places through the
uint32 view of an f32 scratch `buf`. The bottom half's copy targets view rows 4..12
instead of 0..8: rows 0..4 of `buf` are never written, and the copy out sends them to
the output (on a TPU: whatever VMEM held), while rows 8..12 take both copies at once.

Expected finding: kind=uninitialized buffer=buf range=[0:4, 0:128] line=32
Expected finding: kind=race buffer=buf range=[8:12, 0:128] line=29 args=--races
(pallas-check follows the view element by element: the fixed twin's copies move every
bit exactly and never overlap)
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

ROWS = 16


def swap_kernel(x_hbm, o_hbm, buf, sems):
    bits = buf.bitcast(jnp.uint32)  # (16, 128) uint32 over the f32 scratch
    top = pltpu.make_async_copy(x_hbm.at[pl.ds(0, 8)], bits.at[pl.ds(8, 8)], sems.at[0])
    # BUG: the bottom half belongs in view rows 0..8, not 4..12.
    bottom = pltpu.make_async_copy(x_hbm.at[pl.ds(8, 8)], bits.at[pl.ds(4, 8)], sems.at[1])
    top.start()
    bottom.start()
    top.wait()
    bottom.wait()
    pltpu.sync_copy(bits, o_hbm)


def swap_halves(x):
    return pl.pallas_call(
        swap_kernel,
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        out_shape=jax.ShapeDtypeStruct((ROWS, 128), jnp.uint32),
        scratch_shapes=[pltpu.VMEM((ROWS, 128), jnp.float32), pltpu.SemaphoreType.DMA((2,))],
    )(x)


def bit_patterns():
    """Every kind of f32 bit pattern an f32 conversion would change, then random bits."""
    special = [0x3F50F195, 0x7FC00001, 0x7F800001, 0xFFC00123, 0x7FBFFFFF, 0x00000001,
               0x807FFFFF, 0x00400000, 0x80000000, 0x7F800000, 0xFF800000, 0xFFFFFFFF]
    bits = np.random.default_rng(0).integers(0, 2**32, ROWS * 128, dtype=np.uint64)
    bits[:len(special)] = special
    bits[8 * 128: 8 * 128 + len(special)] = special
    return bits.astype(np.uint32).reshape(ROWS, 128)


if __name__ == "__main__":
    x = bit_patterns()
    out = np.asarray(jax.jit(swap_halves)(jnp.asarray(x)))
    print("dma_bitcast_bits_bug: matches reference:",
          out.tobytes() == np.roll(x, 8, axis=0).tobytes())
