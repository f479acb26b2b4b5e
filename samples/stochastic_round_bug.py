"""BUG: stochastic rounding fed random bits in the top byte of each word, which the chip
does not read (twin of stochastic_round_ok.py, which passes uint32 words whole).

The kernel is stochastic_round_ok's. The script makes its random words as XLA's
StochasticConvert convention would take them, the random bits first: 8 random bits in the
top byte, `bits(key, shape, uint8).astype(uint32) << 24`. A TPU v5e compares only the LOW
23 bits of each word with the input's fraction (hardware/README.md, "Stochastic rounding
and subnormals"): here they are all zero, below every fraction, so every value off the
bfloat16 grid rounds away from zero, every time. Each result is still a neighbour of its
input, which is why nothing fails; the mean over the draws is no longer the input.

Run: pallas-check run samples/stochastic_round_bug.py
Expected finding: kind=random-misuse buffer=stochastic_round bits line=27
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

ROWS = 4096  # random draws per input value: one column per value


def round_kernel(x_ref, bits_ref, o_ref):
    o_ref[...] = pltpu.stochastic_round(x_ref[...], bits_ref[...],
                                        target_dtype=jnp.bfloat16)


def stochastic_round(x, bits):
    return pl.pallas_call(
        round_kernel,
        grid=(x.shape[0] // 512,),
        in_specs=[pl.BlockSpec((512, 128), lambda i: (i, 0))] * 2,
        out_specs=pl.BlockSpec((512, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, jnp.bfloat16),
    )(x, bits)


def neighbours(x):
    """The bfloat16 values just below and just above x (both x where bfloat16 holds it)."""
    near = x.astype(ml_dtypes.bfloat16)
    back = near.astype(np.float32)
    below = np.where(back > x, np.nextafter(near, ml_dtypes.bfloat16(-np.inf)), near)
    above = np.where(back < x, np.nextafter(near, ml_dtypes.bfloat16(np.inf)), near)
    return below.astype(np.float32), above.astype(np.float32)


if __name__ == "__main__":
    rng = np.random.default_rng(28)
    values = rng.standard_normal(128).astype(np.float32)
    values[:6] = [1 + 2**-9, -(1 + 3 * 2**-10), 1.0, 0.0, 3 * 2**-130, 1e30]
    x = np.broadcast_to(values, (ROWS, 128)).copy()
    # BUG: 8 random bits in the top byte; the chip reads the low 23 bits of each word.
    bits = jax.random.bits(jax.random.key(0), (ROWS, 128), dtype=jnp.uint8)
    bits = bits.astype(jnp.uint32) << 24
    out = np.asarray(jax.jit(stochastic_round)(jnp.asarray(x), bits)).astype(np.float32)
    below, above = neighbours(x)
    subnormal = (x != 0) & (np.abs(x) < np.finfo(np.float32).tiny)
    below, above = np.where(subnormal, 0, below), np.where(subnormal, 0, above)
    assert np.all((out == below) | (out == above)), "a result is not a neighbour"
    spacing = (above - below)[0]
    error = np.abs(out.astype(np.float64).mean(axis=0) - np.where(subnormal[0], 0, values))
    print("stochastic_round_bug: unbiased:",
          bool(np.all(error <= 8 * 0.5 * spacing / np.sqrt(ROWS) + 1e-45)))
