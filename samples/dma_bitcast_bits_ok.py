"""uint32 bit patterns moved by DMAs through a bitcast view of an f32 scratch, bit for bit.

A kernel swaps the two 8-row halves of a (16, 128) uint32 array (hashes, packed keys, raw
float bits) through VMEM scratch that the kernel keeps as f32: each half lands in the
other half of `buf` through `buf.bitcast(jnp.uint32)`, and the whole view goes back out
to HBM. A DMA moves bytes: NaN payloads, signalling NaNs, denormals and 0x3f50f195 come
out exactly as they went in.

Run: pallas-check run samples/dma_bitcast_bits_ok.py --races
Expected findings: none.
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
    bottom = pltpu.make_async_copy(x_hbm.at[pl.ds(8, 8)], bits.at[pl.ds(0, 8)], sems.at[1])
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
    np.testing.assert_array_equal(out, np.concatenate([x[8:], x[:8]]))
    assert out[8, 0] == 0x3F50F195 and out.tobytes() == np.roll(x, 8, axis=0).tobytes()
    print("dma_bitcast_bits_ok: output matches")
