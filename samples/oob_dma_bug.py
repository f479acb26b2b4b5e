"""A manual DMA copies a halo window that runs past the end of the HBM array.

x stays in HBM (memory_space=pl.ANY). Each grid step DMAs its 8 rows plus the next 8
(a 16-row halo window) into VMEM and adds the two halves. At the last step (i=3) the
window x_hbm[24:40] runs 8 rows past the end of x (32 rows); on a TPU the DMA reads
past the array or faults.

Expected finding: kind=out-of-bounds buffer=x_hbm range=[24:40, 0:128] line=25
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
    # BUG: at the last step the 16-row window needs 8 rows that do not exist.
    copy = pltpu.make_async_copy(x_hbm.at[pl.ds(start, 16), :], win_ref, sem)
    copy.start()
    copy.wait()
    o_ref[...] = win_ref[pl.ds(0, 8), :] + win_ref[pl.ds(8, 8), :]


def halo_sum(x):
    return pl.pallas_call(
        halo_kernel,
        grid=(x.shape[0] // 8,),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM((16, 128), jnp.float32), pltpu.SemaphoreType.DMA],
    )(x)


if __name__ == "__main__":
    x = jnp.arange(ROWS * 128, dtype=jnp.float32).reshape(ROWS, 128)
    out = jax.jit(halo_sum)(x)
    print("oob_dma_bug: out[-1, :4] =", np.asarray(out)[-1, :4])
