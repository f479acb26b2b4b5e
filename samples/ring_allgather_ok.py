"""A correct ring all-gather on 4 devices with remote DMAs.

Every device starts with one (8, 128) block and ends with all four, in device order.
Each device first copies its own block into its slot of the output, then does a barrier
handshake with both ring neighbours (so both are inside the kernel before any remote
write), then passes blocks to the right N-1 times: at step s it sends the slot it
received at step s-1 (its own at step 0) into the same slot of its right neighbour, and
waits both for its send and for the block its left neighbour sends it.

Each slot has its own receive semaphore. With one receive semaphore for all slots the
kernel would be wrong on a TPU: a neighbour that has finished *sending* block s (its send
semaphore) may already send block s+1 while block s is still in flight, the two land in
any order, and a wait for "one block's bytes" can be satisfied by block s+1 while the
block this device forwards next has not arrived (pallas-check reports that race).

Run: pallas-check run samples/ring_allgather_ok.py --devices 4 --races
Expected findings: none (also under --dma eager, and --dma random --schedules 20).
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


def all_gather_kernel(x_ref, o_ref, local_sem, send_sem, recv_sems):
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
        arriving = lax.rem(slot + NUM_DEVICES - 1, NUM_DEVICES)  # what the left one sends

        def remote_copy(i):
            return pltpu.make_async_remote_copy(
                src_ref=o_ref.at[i], dst_ref=o_ref.at[i], send_sem=send_sem,
                recv_sem=recv_sems.at[i], device_id=(right,),
                device_id_type=pl.DeviceIdType.MESH)

        remote_copy(slot).start()
        remote_copy(slot).wait_send()  # our block has left
        remote_copy(arriving).wait_recv()  # the left neighbour's block has arrived
        return carry

    lax.fori_loop(0, NUM_DEVICES - 1, step, 0)


def all_gather(x):
    return pl.pallas_call(
        all_gather_kernel,
        out_shape=jax.ShapeDtypeStruct((NUM_DEVICES,) + x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        scratch_shapes=[pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA,
                        pltpu.SemaphoreType.DMA((NUM_DEVICES,))],
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
    np.testing.assert_allclose(out, expected)
    print("ring_allgather_ok: output matches")


if __name__ == "__main__":
    main()
