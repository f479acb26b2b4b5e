"""A remote copy whose sender tells the receiver "done" when its *send* has finished.

Device 0 copies its block into device 1's `inbox`, waits on the copy's send semaphore and
then signals device 1's `ready` semaphore; device 1 waits for `ready` and reads `inbox`.
On a TPU the send semaphore says only that the source has been read (device 0 may reuse
it); the data lands later, and only the receive semaphore on device 1 says it has. So
device 1 can read `inbox` before the bytes arrive.

Run: pallas-check run samples/send_not_landed_bug.py --devices 2 --races
Expected finding: kind=race buffer=inbox range=[0:8, 0:128] line=38 args=--devices 2 --races
(line 38 starts device 0's copy, whose write races with device 1's read of inbox, line 45)
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

MESH = pl.DeviceIdType.MESH


def handoff_kernel(x_ref, o_ref, inbox, send_sem, recv_sem, ready):
    me = lax.axis_index("x")
    barrier = pltpu.get_barrier_semaphore()  # both devices are inside the kernel
    pl.semaphore_signal(barrier, device_id=(1 - me,), device_id_type=MESH)
    pl.semaphore_wait(barrier, 1)
    o_ref[...] = x_ref[...]
    copy = pltpu.make_async_remote_copy(src_ref=x_ref, dst_ref=inbox, send_sem=send_sem,
                                        recv_sem=recv_sem, device_id=(1,),
                                        device_id_type=MESH)

    @pl.when(me == 0)
    def _():
        copy.start()
        copy.wait_send()
        pl.semaphore_signal(ready, device_id=(1,), device_id_type=MESH)  # BUG: not landed

    @pl.when(me == 1)
    def _():
        pl.semaphore_wait(ready, 1)
        o_ref[...] = inbox[...] + x_ref[...]
        copy.wait_recv()  # keeps the semaphore balanced, but too late


def handoff(x):
    return pl.pallas_call(
        handoff_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM(x.shape, x.dtype), pltpu.SemaphoreType.DMA,
                        pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.REGULAR],
        compiler_params=pltpu.CompilerParams(collective_id=0),
    )(x)


if __name__ == "__main__":
    mesh = jax.make_mesh((2,), ("x",))
    x = jnp.arange(2 * 8 * 128, dtype=jnp.float32).reshape(2 * 8, 128)
    out = jax.jit(jax.shard_map(handoff, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                                check_vma=False))(jax.device_put(x, NamedSharding(mesh, P("x"))))
    expected = np.concatenate([x[:8], x[8:] + x[:8]])
    print("send_not_landed_bug: output", "matches" if np.allclose(out, expected) else "is wrong")
