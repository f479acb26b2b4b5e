"""A correct kernel whose accumulator is twice as large as it needs: a (16, 128) f32
scratch of which only rows 0:8 are ever written or read (the block is (8, 128)).

Expected findings: none. The report notes the memory the kernel never touches:
acc_ref [8:16, 0:128] never touched: 4.00 KiB of 8.00 KiB VMEM -- VMEM a kernel author
can win back (scratch of (8, 128)) before a vmem-exceeded.
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
        acc_ref[0:8, :] = jnp.zeros((8, 128), jnp.float32)

    acc_ref[0:8, :] += x_ref[...]

    @pl.when(k == pl.num_programs(0) - 1)
    def _():
        o_ref[...] = acc_ref[0:8, :]


def block_sum(x):
    return pl.pallas_call(
        block_sum_kernel,
        grid=(x.shape[0] // 8,),
        in_specs=[pl.BlockSpec((8, 128), lambda k: (k, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda k: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((8, 128), x.dtype),
        scratch_shapes=[pltpu.VMEM((16, 128), jnp.float32)],  # rows 8:16 never used
    )(x)


if __name__ == "__main__":
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    out = jax.jit(block_sum)(x)
    np.testing.assert_allclose(out, x.reshape(4, 8, 128).sum(axis=0))
    print("unused_scratch_ok: output matches")
