"""A swap of halves between two TensorCores whose DMAs both go to core 0.

The device id names core 0 (`{"core": 0}`) instead of the other core: core 0's `theirs`
receives two copies, and core 1 waits for rows that never come. (Before pallas-check
resolved core axes in device ids it sent each copy to the sender itself, reported nothing,
and the output was wrong.)

For a chip with two TensorCores (v7x). On a TPU v5e (one TensorCore, pallas-check's
default `--tpu`) the cores run one after another and a DMA to core 0 -- the chip's one
core -- lands in the sender's own `theirs`: each core copies its rows to itself, the
kernel finishes with the input unswapped (as the chip did in session 30), and no memory
defect is left to find there.

Run: pallas-check run samples/core_swap_bug.py --tpu v7x --races
Expected finding: kind=deadlock buffer=recv_sem line=42 args=--tpu v7x --races
Expected finding: kind=race buffer=theirs range=[0:8, 0:128] line=41 args=--tpu v7x --races
(line 42 is core 1's wait for its incoming copy, which no DMA will signal; line 41 starts
the two copies that both land in core 0's `theirs`)
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

MESH = pltpu.create_tensorcore_mesh("core", num_cores=2)


def swap(x):
    @pl.kernel(out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), mesh=MESH,
               scratch_types=[pltpu.VMEM((8, 128), jnp.float32),
                              pltpu.VMEM((8, 128), jnp.float32),
                              pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA])
    def swap_kernel(x_hbm, o_hbm, mine, theirs, send_sem, recv_sem):
        core = jax.lax.axis_index("core")
        pltpu.sync_copy(x_hbm.at[pl.ds(core * 8, 8)], mine)
        copy = pltpu.make_async_remote_copy(
            src_ref=mine, dst_ref=theirs, send_sem=send_sem, recv_sem=recv_sem,
            device_id={"core": 0}, device_id_type=pl.DeviceIdType.MESH)  # bug: core 1 - core
        copy.start()
        copy.wait()
        pltpu.sync_copy(theirs, o_hbm.at[pl.ds(core * 8, 8)])

    return swap_kernel(x)


if __name__ == "__main__":
    x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
    out = jax.jit(swap)(x)
    print("core_swap_bug: output matches" if np.allclose(out, jnp.concatenate([x[8:], x[:8]]))
          else "core_swap_bug: output is wrong")
