"""The fix of dma_same_dst_bug.py: each copy lands in its own slot of `buf`.

Run: pallas-check run samples/dma_same_dst_ok.py --races
Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def gather_add_kernel(x_hbm, o_ref, buf, sems):
    i = pl.program_id(0)
    top = pltpu.make_async_copy(x_hbm.at[pl.ds(i * 16, 8), :], buf.at[0], sems.at[0])
    bottom = pltpu.make_async_copy(x_hbm.at[pl.ds(i * 16 + 8, 8), :], buf.at[1], sems.at[1])
    top.start()
    bottom.start()
    top.wait()
    bottom.wait()
    o_ref[...] = buf[0] + buf[1]


def gather_add(x):
    return pl.pallas_call(
        gather_add_kernel,
        grid=(x.shape[0] // 16,),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((x.shape[0] // 2, x.shape[1]), x.dtype),
        scratch_shapes=[pltpu.VMEM((2, 8, 128), jnp.float32), pltpu.SemaphoreType.DMA((2,))],
    )(x)


if __name__ == "__main__":
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    out = jax.jit(gather_add)(x)
    xs = x.reshape(2, 2, 8, 128)
    np.testing.assert_allclose(out, (xs[:, 0] + xs[:, 1]).reshape(16, 128))
    print("dma_same_dst_ok: output matches")
