"""The fix of core_map_race_bug.py: each core of the 2-TensorCore mesh writes its own
rows of the output.

Right on any chip: at once on two TensorCores (v7x), one core after the other on a TPU v5e,
whose one TensorCore ran it so with the right output (session 30, hardware/README.md).

Run: pallas-check run samples/core_map_race_ok.py --races
Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

MESH = pltpu.create_tensorcore_mesh("core", num_cores=2)


def double(x):
    @pl.kernel(out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), mesh=MESH,
               scratch_types=[pltpu.VMEM((8, 128), jnp.float32)])
    def double_kernel(x_hbm, o_hbm, buf):
        core = jax.lax.axis_index("core")
        pltpu.sync_copy(x_hbm.at[pl.ds(core * 8, 8)], buf)
        buf[...] = buf[...] * 2.0
        row = core * 8
        pltpu.sync_copy(buf, o_hbm.at[pl.ds(row, 8)])

    return double_kernel(x)


if __name__ == "__main__":
    x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
    out = jax.jit(double)(x)
    np.testing.assert_allclose(out, x * 2)
    print("core_map_race_ok: output matches")
