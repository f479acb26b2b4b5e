"""Two TensorCores swap their halves: each core copies its rows, from its own VMEM, into the
OTHER core's VMEM with a DMA addressed to a core (`device_id={"core": 1 - core}`), then
writes what it received to its half of the output.

For a chip with two TensorCores (v7x; v4 and v5p as a megacore). On a TPU v5e (one
TensorCore) the cores run one after another and core 0's DMA to core 1 never arrives: the
chip hung on this kernel (hardware/README.md, session 30), and a run on the v5e
(pallas-check's default `--tpu`) reports a deadlock at the copy's wait.

Run: pallas-check run samples/core_swap_ok.py --tpu v7x --races
Expected findings: none.
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
        other = 1 - core
        copy = pltpu.make_async_remote_copy(
            src_ref=mine, dst_ref=theirs, send_sem=send_sem, recv_sem=recv_sem,
            device_id={"core": other}, device_id_type=pl.DeviceIdType.MESH)
        copy.start()
        copy.wait()  # our rows have left, the other core's have arrived in `theirs`
        pltpu.sync_copy(theirs, o_hbm.at[pl.ds(core * 8, 8)])

    return swap_kernel(x)


if __name__ == "__main__":
    x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
    out = jax.jit(swap)(x)
    np.testing.assert_allclose(out, jnp.concatenate([x[8:], x[:8]]))
    print("core_swap_ok: output matches")
