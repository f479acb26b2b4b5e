"""Fixed bitcast_view_race_bug.py: the two copies fill the disjoint halves of the bf16
view of `buf` (its rows 0..8 and 8..16), in flight at once without a race.

Run: pallas-check run samples/bitcast_view_race_ok.py --races
Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def unpack_kernel(x_hbm, o_ref, buf, sems):
    view = buf.bitcast(jnp.bfloat16)  # (32, 128) bf16
    first = pltpu.make_async_copy(x_hbm.at[pl.ds(0, 16)], view.at[pl.ds(0, 16)], sems.at[0])
    second = pltpu.make_async_copy(x_hbm.at[pl.ds(16, 16)], view.at[pl.ds(16, 16)],
                                   sems.at[1])
    first.start()
    second.start()
    first.wait()
    second.wait()
    o_ref[...] = view[...].astype(jnp.float32)


def unpack(x):
    return pl.pallas_call(
        unpack_kernel,
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_shape=jax.ShapeDtypeStruct((32, 128), jnp.float32),
        scratch_shapes=[pltpu.VMEM((16, 128), jnp.float32), pltpu.SemaphoreType.DMA((2,))],
    )(x)


if __name__ == "__main__":
    x = (jnp.arange(32 * 128) % 251).astype(jnp.bfloat16).reshape(32, 128)
    out = jax.jit(unpack)(x)
    np.testing.assert_array_equal(out, x.astype(jnp.float32))
    print("bitcast_view_race_ok: output matches")
