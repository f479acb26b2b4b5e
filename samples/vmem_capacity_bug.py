"""A column sum that stages its whole input in VMEM: 16 MiB of scratch, too much for v5e.

The kernel walks x in (512, 128) row blocks and copies each one into a scratch buffer
shaped like all of x, summing the buffer at the last step. On a TPU the scratch lives in
VMEM: 16 MiB of it plus the double-buffered input blocks is over v5e's 16 MiB scoped VMEM
limit, and the compiler refuses the kernel (E1001). pallas-check reckons every call's VMEM
before simulating it: the call is reported at its pallas_call line, naming the scratch,
and is not simulated (its output is NaN, as never-written memory).

Expected finding: kind=vmem-exceeded buffer=stage_ref line=34
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK = 512


def column_sum_kernel(x_ref, o_ref, stage_ref):
    k = pl.program_id(0)
    stage_ref[pl.ds(k * BLOCK, BLOCK), :] = x_ref[...]

    @pl.when(k == pl.num_programs(0) - 1)
    def _():
        o_ref[...] = jnp.broadcast_to(jnp.sum(stage_ref[...], axis=0, keepdims=True),
                                      o_ref.shape)


def column_sum(x):
    # BUG: the scratch holds all of x; one (8, 128) accumulator would do.
    return pl.pallas_call(
        column_sum_kernel,
        grid=(x.shape[0] // BLOCK,),
        in_specs=[pl.BlockSpec((BLOCK, 128), lambda k: (k, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda k: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        scratch_shapes=[pltpu.VMEM(x.shape, jnp.float32)],
    )(x)


if __name__ == "__main__":
    x = jnp.ones((32768, 128), jnp.float32)
    out = jax.jit(column_sum)(x)
    expected = np.broadcast_to(np.asarray(x).sum(axis=0), (8, 128))
    print("vmem_capacity_bug: matches reference:", bool(np.allclose(out, expected)))
