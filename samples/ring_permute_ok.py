"""A correct ppermute-style ring on 4 devices: each device sends its block to its right
neighbour with a remote DMA, after a barrier handshake with both neighbours.

Run: pallas-check run samples/ring_permute_ok.py --devices 4 --races
Expected findings: none.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

NUM_DEVICES = 4


def permute_kernel(x_ref, o_ref, send_sem, recv_sem):
    me = lax.axis_index("x")
    right = lax.rem(me + 1, NUM_DEVICES)
    left = lax.rem(me - 1 + NUM_DEVICES, NUM_DEVICES)
    # Handshake: both neighbours are in the kernel (their buffers exist) before we write.
    barrier = pltpu.get_barrier_semaphore()
    pl.semaphore_signal(barrier, device_id=(left,), device_id_type=pl.DeviceIdType.MESH)
    pl.semaphore_signal(barrier, device_id=(right,), device_id_type=pl.DeviceIdType.MESH)
    pl.semaphore_wait(barrier, 2)
    copy = pltpu.make_async_remote_copy(
        src_ref=x_ref, dst_ref=o_ref, send_sem=send_sem, recv_sem=recv_sem,
        device_id=(right,), device_id_type=pl.DeviceIdType.MESH)
    copy.start()
    copy.wait()


def permute(x):
    return pl.pallas_call(
        permute_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        scratch_shapes=[pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA],
        compiler_params=pltpu.CompilerParams(collective_id=0),
    )(x)


def main():
    mesh = jax.make_mesh((NUM_DEVICES,), ("x",))
    x = jnp.arange(NUM_DEVICES * 8 * 128, dtype=jnp.float32).reshape(NUM_DEVICES * 8, 128)
    x = jax.device_put(x, NamedSharding(mesh, P("x")))
    f = jax.jit(jax.shard_map(permute, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                              check_vma=False))
    out = np.asarray(f(x))
    expected = np.roll(np.asarray(x).reshape(NUM_DEVICES, 8, 128), 1, axis=0).reshape(-1, 128)
    np.testing.assert_allclose(out, expected)
    print("ring_permute_ok: output matches")


if __name__ == "__main__":
    main()
