"""Double buffering whose two copies share one DMA semaphore.

Both slot copies signal `sems.at[0]`. The wait for slot 0 is satisfied by whichever copy
finishes first: when slot 1's copy wins, slot 0 is read before its data arrives. `eager`
lands each copy at its start and misses it; `on_wait` lands the newest copy first and shows
it; `--dma random --schedules N` explores the landing orders.

Run: pallas-check run samples/shared_sem_bug.py --dma random --races --schedules 20
Expected finding: kind=race buffer=buf range=[0, 0:8, 0:128] line=24 args=--dma random --races --schedules 20
(line 24 starts slot 0's copy, whose write races with the read of slot 0 on line 27)
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def double_kernel(x_hbm, o_ref, buf, sems):
    copy0 = pltpu.make_async_copy(x_hbm.at[0], buf.at[0], sems.at[0])
    # BUG: slot 1's copy should signal sems.at[1].
    copy1 = pltpu.make_async_copy(x_hbm.at[1], buf.at[1], sems.at[0])
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
    print("shared_sem_bug: output", "matches" if np.allclose(out, x * 2) else "is wrong")
