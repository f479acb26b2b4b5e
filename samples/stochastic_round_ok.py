"""Stochastic rounding of float32 to bfloat16 in a kernel (`pltpu.stochastic_round`), fed
uint32 random bits made outside the kernel, as JAX's own test of the op does.

What any correct stochastic rounding gives, and what the script checks against numpy (its
neighbours from ml_dtypes, not from pallas-check's arithmetic): each result is one of the
two bfloat16 neighbours of its input (the input itself when bfloat16 holds it exactly), and
over many random bits the mean of the results approaches the input (unbiased). A float32
subnormal input gives 0: a TPU v5e flushed 3 * 2^-130 to 0 in session 30 (the first version
of this sample asserted it kept, and failed on the chip). Which bit patterns round up is
the chip's and is not asserted here (pallas-check simulates the v5e's rule, docs/limitations.md).

Run: pallas-check run samples/stochastic_round_ok.py
Expected findings: none.
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
    bits = jax.random.bits(jax.random.key(0), (ROWS, 128), dtype=jnp.uint32)
    out = np.asarray(jax.jit(stochastic_round)(jnp.asarray(x), bits)).astype(np.float32)
    below, above = neighbours(x)
    subnormal = (x != 0) & (np.abs(x) < np.finfo(np.float32).tiny)
    assert np.all(out[subnormal] == 0), "a float32 subnormal is not flushed to zero"
    below, above = np.where(subnormal, 0, below), np.where(subnormal, 0, above)
    assert np.all((out == below) | (out == above)), "a result is not a neighbour"
    exact = (below == above) & ~subnormal
    np.testing.assert_array_equal(out[exact], x[exact])
    # Unbiased: the mean over the draws is the input, within 8 standard errors of a
    # fair coin between the neighbours.
    spacing = (above - below)[0]
    error = np.abs(out.astype(np.float64).mean(axis=0) - np.where(subnormal[0], 0, values))
    assert np.all(error <= 8 * 0.5 * spacing / np.sqrt(ROWS) + 1e-45), error.max()
    print("stochastic_round_ok: output matches")
