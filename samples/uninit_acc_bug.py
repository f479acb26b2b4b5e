"""A row-block reduction whose VMEM accumulator is never initialised.

The kernel sums x over row blocks into a (8, 128) f32 scratch accumulator and writes
it out at the last step, but the `@pl.when(k == 0)` that zeroes the accumulator was
forgotten: the first `acc_ref[...] += ...` reads never-written VMEM. (With
`--uninit zero` this happens to give the right answer, which is why the bug survives
testing on some backends; pallas-check reports it under either fill.)

Expected finding: kind=uninitialized buffer=acc_ref range=[0:8, 0:128] line=24
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def block_sum_kernel(x_ref, o_ref, acc_ref):
    k = pl.program_id(0)

    # BUG: missing  @pl.when(k == 0): acc_ref[...] = jnp.zeros_like(acc_ref)

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
    expected = x.reshape(4, 8, 128).sum(axis=0)
    print("uninit_acc_bug: matches reference:", bool(np.allclose(out, expected)))
