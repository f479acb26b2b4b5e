"""A ring all-gather on 4 devices that relies on blocks arriving in the order they were sent.

The same kernel as ring_allgather_ok.py, but every block a device receives lands on ONE
receive semaphore, and each step waits for "one block's worth of bytes" on it. On a TPU a
neighbour that has finished *sending* block s (its send semaphore: the source was read)
goes on to send block s+1 while block s is still in flight; DMAs on one semaphore land in
any order, so the wait can be satisfied by block s+1 while block s, which this device
forwards at its next step, has not arrived: the forwarding DMA reads a slot that the
incoming DMA has yet to write. pallas-check's `on_wait` mode lands the newest DMA first,
so the race shows up under the default mode.

Run: pallas-check run samples/ring_allgather_bug.py --devices 4 --races
Expected finding: kind=race buffer=o_ref range=[0, 0:8, 0:128] line=49 args=--devices 4 --races
(line 49 starts the copy of a slot: device 0's copy lands in device 1's slot 0 while device
1's own copy of that slot, to device 2, reads it)
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

NUM_DEVICES = 4


def all_gather_kernel(x_ref, o_ref, local_sem, send_sem, recv_sem):
    me = lax.axis_index("x")
    right = lax.rem(me + 1, NUM_DEVICES)
    left = lax.rem(me + NUM_DEVICES - 1, NUM_DEVICES)

    own = pltpu.make_async_copy(x_ref, o_ref.at[me], local_sem)
    own.start()
    own.wait()

    barrier = pltpu.get_barrier_semaphore()
    pl.semaphore_signal(barrier, device_id=(left,), device_id_type=pl.DeviceIdType.MESH)
    pl.semaphore_signal(barrier, device_id=(right,), device_id_type=pl.DeviceIdType.MESH)
    pl.semaphore_wait(barrier, 2)

    def step(s, carry):
        slot = lax.rem(me - s + NUM_DEVICES, NUM_DEVICES)
        copy = pltpu.make_async_remote_copy(
            src_ref=o_ref.at[slot], dst_ref=o_ref.at[slot], send_sem=send_sem,
            recv_sem=recv_sem, device_id=(right,), device_id_type=pl.DeviceIdType.MESH)
        copy.start()
        copy.wait()  # our send has left, and the left neighbour's block has arrived
        return carry

    lax.fori_loop(0, NUM_DEVICES - 1, step, 0)


def all_gather(x):
    return pl.pallas_call(
        all_gather_kernel,
        out_shape=jax.ShapeDtypeStruct((NUM_DEVICES,) + x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        scratch_shapes=[pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA,
                        pltpu.SemaphoreType.DMA],
        compiler_params=pltpu.CompilerParams(collective_id=0),
    )(x)


def main():
    mesh = jax.make_mesh((NUM_DEVICES,), ("x",))
    x = jnp.arange(NUM_DEVICES * 8 * 128, dtype=jnp.float32).reshape(NUM_DEVICES * 8, 128)
    x = jax.device_put(x, NamedSharding(mesh, P("x")))
    f = jax.jit(jax.shard_map(all_gather, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                              check_vma=False))
    out = np.asarray(f(x)).reshape(NUM_DEVICES, NUM_DEVICES, 8, 128)
    expected = jnp.broadcast_to(jnp.asarray(x).reshape(NUM_DEVICES, 8, 128),
                                (NUM_DEVICES, NUM_DEVICES, 8, 128))
    # The race may or may not corrupt the output, depending on the order of landing.
    print("ring_allgather_bug: output " + ("matches" if np.allclose(out, expected)
                                           else "is wrong"))


if __name__ == "__main__":
    main()
