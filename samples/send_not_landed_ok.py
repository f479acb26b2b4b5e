"""A remote copy handed off correctly: the receiver waits on the copy's receive semaphore.

The fix of send_not_landed_bug.py: device 0 waits on the send semaphore (its source may be
reused), device 1 waits on the receive semaphore (the data has landed) before it reads
`inbox`. No other signal is needed.

Run: pallas-check run samples/send_not_landed_ok.py --devices 2 --races
Expected findings: none.
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


def handoff_kernel(x_ref, o_ref, inbox, send_sem, recv_sem):
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
        copy.wait_send()  # x_ref may be reused from here on

    @pl.when(me == 1)
    def _():
        copy.wait_recv()  # the data has landed in inbox
        o_ref[...] = inbox[...] + x_ref[...]


def handoff(x):
    return pl.pallas_call(
        handoff_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM(x.shape, x.dtype), pltpu.SemaphoreType.DMA,
                        pltpu.SemaphoreType.DMA],
        compiler_params=pltpu.CompilerParams(collective_id=0),
    )(x)


if __name__ == "__main__":
    mesh = jax.make_mesh((2,), ("x",))
    x = jnp.arange(2 * 8 * 128, dtype=jnp.float32).reshape(2 * 8, 128)
    out = jax.jit(jax.shard_map(handoff, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                                check_vma=False))(jax.device_put(x, NamedSharding(mesh, P("x"))))
    expected = np.concatenate([x[:8], x[8:] + x[:8]])
    print("send_not_landed_ok: output", "matches" if np.allclose(out, expected) else "is wrong")
