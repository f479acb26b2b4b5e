"""Two DMAs in flight into the same VMEM buffer.

The kernel gathers two row blocks of `x_hbm` and adds them. Both copies land in the one
scratch buffer `buf`, and both are started before either is waited on: on a TPU the two
writes into `buf` can land in either order (or interleave), and the first block is lost.

Run: pallas-check run samples/dma_same_dst_bug.py --races
Expected finding: kind=race buffer=buf range=[0:8, 0:128] line=27 args=--races
(line 27 starts the second copy, whose write races with the first copy's, line 26)
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def gather_add_kernel(x_hbm, o_ref, buf, sems):
    i = pl.program_id(0)
    top = pltpu.make_async_copy(x_hbm.at[pl.ds(i * 16, 8), :], buf, sems.at[0])
    # BUG: the bottom half lands in the same buffer as the top half; it needs its own
    # slot (or the top copy must be waited for and consumed first).
    bottom = pltpu.make_async_copy(x_hbm.at[pl.ds(i * 16 + 8, 8), :], buf, sems.at[1])
    acc = jnp.zeros((8, 128), jnp.float32)
    top.start()
    bottom.start()
    top.wait()
    acc += buf[...]
    bottom.wait()
    acc += buf[...]
    o_ref[...] = acc


def gather_add(x):
    return pl.pallas_call(
        gather_add_kernel,
        grid=(x.shape[0] // 16,),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((x.shape[0] // 2, x.shape[1]), x.dtype),
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA((2,))],
    )(x)


if __name__ == "__main__":
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    out = jax.jit(gather_add)(x)
    blocks = np.asarray(x).reshape(2, 2, 8, 128)
    expected = (blocks[:, 0] + blocks[:, 1]).reshape(16, 128)
    print("dma_same_dst_bug: output", "matches" if np.allclose(out, expected) else "is wrong")
