"""A remote DMA without a barrier handshake, on 2 devices.

Each device clears its landing buffer `recv_buf`, then sends its block into the other
device's `recv_buf`. Nothing orders the other device's clearing store before our remote
write, so on a TPU the clear can land after the data and wipe it.

Run: pallas-check run samples/remote_no_barrier_bug.py --devices 2 --races
Expected finding: kind=race buffer=recv_buf range=[0:8, 0:128] line=34 args=--devices 2 --races
(line 34 starts the peer's remote copy, whose write lands in recv_buf; the race's other
access is this device's clearing store, line 32)
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
    # BUG: no barrier between clearing our landing buffer and the peer's write into it.
    recv_buf[...] = jnp.zeros_like(recv_buf)
    # The peer may already be writing into recv_buf here.
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
    # Whether the data survives depends on timing; the race is the bug either way.
    print("remote_no_barrier_bug: output", "matches" if np.allclose(out, expected) else "is wrong")


if __name__ == "__main__":
    main()
