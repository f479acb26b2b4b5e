"""The fix of remote_no_barrier_bug.py: a barrier handshake after clearing the landing
buffer, before the remote write into the peer's.

Run: pallas-check run samples/remote_no_barrier_ok.py --devices 2 --races
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

NUM_DEVICES = 2


def exchange_kernel(x_ref, o_ref, recv_buf, send_sem, recv_sem):
    me = lax.axis_index("x")
    other = lax.rem(me + 1, NUM_DEVICES)
    copy = pltpu.make_async_remote_copy(
        src_ref=x_ref, dst_ref=recv_buf, send_sem=send_sem, recv_sem=recv_sem,
        device_id=(other,), device_id_type=pl.DeviceIdType.MESH)
    recv_buf[...] = jnp.zeros_like(recv_buf)
    # Handshake: tell the peer our landing buffer is ready; wait until theirs is.
    barrier = pltpu.get_barrier_semaphore()
    pl.semaphore_signal(barrier, device_id=(other,), device_id_type=pl.DeviceIdType.MESH)
    pl.semaphore_wait(barrier, 1)
    copy.start()
    copy.wait()
    o_ref[...] = recv_buf[...] + x_ref[...]


def exchange(x):
    return pl.pallas_call(
        exchange_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec((8, 128), lambda: (0, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda: (0, 0)),
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32),
                        pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA],
        compiler_params=pltpu.CompilerParams(collective_id=0),
    )(x)


def main():
    mesh = jax.make_mesh((NUM_DEVICES,), ("x",))
    x = jnp.arange(NUM_DEVICES * 8 * 128, dtype=jnp.float32).reshape(NUM_DEVICES * 8, 128)
    x = jax.device_put(x, NamedSharding(mesh, P("x")))
    f = jax.jit(jax.shard_map(exchange, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                              check_vma=False))
    out = np.asarray(f(x))
    blocks = np.asarray(x).reshape(NUM_DEVICES, 8, 128)
    expected = (blocks + np.roll(blocks, 1, axis=0)).reshape(-1, 128)
    np.testing.assert_allclose(out, expected)
    print("remote_no_barrier_ok: output matches")


if __name__ == "__main__":
    main()
