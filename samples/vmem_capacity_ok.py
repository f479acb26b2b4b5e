"""The column sum of vmem_capacity_bug.py with an (8, 128) accumulator: a few KiB of VMEM.

Each step folds its (512, 128) block into eight rows of partial sums (zeroed at the first
step); the last step sums the eight rows. The kernel fits every generation's VMEM and is
simulated as usual.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK = 512


def column_sum_kernel(x_ref, o_ref, acc_ref):
    k = pl.program_id(0)

    @pl.when(k == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.sum(x_ref[...].reshape(BLOCK // 8, 8, 128), axis=0)

    @pl.when(k == pl.num_programs(0) - 1)
    def _():
        o_ref[...] = jnp.broadcast_to(jnp.sum(acc_ref[...], axis=0, keepdims=True),
                                      o_ref.shape)


def column_sum(x):
    return pl.pallas_call(
        column_sum_kernel,
        grid=(x.shape[0] // BLOCK,),
        in_specs=[pl.BlockSpec((BLOCK, 128), lambda k: (k, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda k: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32)],
    )(x)


if __name__ == "__main__":
    x = jax.random.normal(jax.random.key(0), (32768, 128), jnp.float32)
    out = jax.jit(column_sum)(x)
    expected = np.broadcast_to(np.asarray(x, np.float64).sum(axis=0), (8, 128))
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-2)
    print("vmem_capacity_ok: output matches")
