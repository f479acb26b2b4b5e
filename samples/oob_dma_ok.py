"""Fixed oob_dma_bug.py: x is padded with 8 zero rows so every halo window exists.

Each grid step DMAs rows [8i, 8i+16) of the padded x into VMEM and adds the halves.
Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

ROWS = 32


def halo_kernel(x_hbm, o_ref, win_ref, sem):
    i = pl.program_id(0)
    start = pl.multiple_of(i * 8, 8)
    copy = pltpu.make_async_copy(x_hbm.at[pl.ds(start, 16), :], win_ref, sem)
    copy.start()
    copy.wait()
    o_ref[...] = win_ref[pl.ds(0, 8), :] + win_ref[pl.ds(8, 8), :]


def halo_sum(x):
    padded = jnp.pad(x, ((0, 8), (0, 0)))  # the fix: the last window now exists
    return pl.pallas_call(
        halo_kernel,
        grid=(x.shape[0] // 8,),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM((16, 128), jnp.float32), pltpu.SemaphoreType.DMA],
    )(padded)


if __name__ == "__main__":
    x = jnp.arange(ROWS * 128, dtype=jnp.float32).reshape(ROWS, 128)
    out = jax.jit(halo_sum)(x)
    nxt = jnp.concatenate([x[8:], jnp.zeros((8, 128), x.dtype)])
    np.testing.assert_allclose(out, x + nxt)
    print("oob_dma_ok: output matches")
