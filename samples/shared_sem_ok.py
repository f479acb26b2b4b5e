"""The fix of shared_sem_bug.py: each slot's copy signals its own semaphore.

Run: pallas-check run samples/shared_sem_ok.py --dma random --races --schedules 20
Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def double_kernel(x_hbm, o_ref, buf, sems):
    copy0 = pltpu.make_async_copy(x_hbm.at[0], buf.at[0], sems.at[0])
    copy1 = pltpu.make_async_copy(x_hbm.at[1], buf.at[1], sems.at[1])
    copy0.start()
    copy1.start()
    copy0.wait()
    o_ref[0] = buf[0] * 2.0
    copy1.wait()
    o_ref[1] = buf[1] * 2.0


def double(x):
    return pl.pallas_call(
        double_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((2, 8, 128), lambda: (0, 0, 0)),
        scratch_shapes=[pltpu.VMEM((2, 8, 128), jnp.float32), pltpu.SemaphoreType.DMA((2,))],
    )(x)


if __name__ == "__main__":
    x = jnp.arange(2 * 8 * 128, dtype=jnp.float32).reshape(2, 8, 128)
    out = jax.jit(double)(x)
    np.testing.assert_allclose(out, x * 2)
    print("shared_sem_ok: output matches")
