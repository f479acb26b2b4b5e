"""Fixed uninit_acc_bug.py: the accumulator is zeroed at the first grid step.

Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def block_sum_kernel(x_ref, o_ref, acc_ref):
    k = pl.program_id(0)

    @pl.when(k == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += x_ref[...]

    @pl.when(k == pl.num_programs(0) - 1)
    def _():
        o_ref[...] = acc_ref[...]


def block_sum(x):
    return pl.pallas_call(
        block_sum_kernel,
        grid=(x.shape[0] // 8,),
        in_specs=[pl.BlockSpec((8, 128), lambda k: (k, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda k: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((8, 128), x.dtype),
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32)],
    )(x)


if __name__ == "__main__":
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    out = jax.jit(block_sum)(x)
    np.testing.assert_allclose(out, x.reshape(4, 8, 128).sum(axis=0))
    print("uninit_acc_ok: output matches")
