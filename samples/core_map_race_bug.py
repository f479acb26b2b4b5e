"""A `pl.kernel` over a 2-TensorCore mesh whose cores both write the same rows of the
output: each core copies its half of the input, doubles it, and writes it back — but to
rows 0:8 on both cores, so the two DMAs race and half of the output is never written.

On a chip with two TensorCores (v7x) the cores run at once: the two writes race. On a TPU
v5e (one TensorCore, pallas-check's default `--tpu`) they run one after another, core 0
first: no race, but rows 8:16 are still never written (the chip's output was wrong too,
session 30).

Run: pallas-check run samples/core_map_race_bug.py --tpu v7x --races
Expected finding: kind=race buffer=o_hbm range=[0:8, 0:128] line=33 args=--tpu v7x --races
Expected finding: kind=unwritten-output buffer=o_hbm range=[8:16, 0:128] line=25
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
        # BUG: should write rows core*8 : core*8+8.
        row = 0
        pltpu.sync_copy(buf, o_hbm.at[pl.ds(row, 8)])

    return double_kernel(x)


if __name__ == "__main__":
    x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
    out = jax.jit(double)(x)
    print("core_map_race_bug: output", "matches" if np.allclose(out, x * 2) else "is wrong")
