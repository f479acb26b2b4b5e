"""A ring all-reduce on 4 devices whose final double barrier waits for one signal, not two.

The same kernel as ring_allreduce_ok.py, but `pl.semaphore_wait(sem, 1)` where both
neighbours signal the scoped barrier semaphore: every device leaves the kernel with one
signal still counted in it (on a TPU, the next kernel to use that address starts with a
stray count).

Run: pallas-check run samples/ring_allreduce_bug.py --devices 4 --races
Expected finding: kind=semaphore-leak buffer=sem line=29 args=--devices 4 --races
(line 29 is the signal to the left neighbour, the last to arrive at device 0)
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
BARRIER_SIGNALS = 1  # bug: one from each neighbour makes 2


def double_barrier(sem, left, right):
    pl.semaphore_signal(sem, 1, device_id=(left,), device_id_type=pl.DeviceIdType.MESH)
    pl.semaphore_signal(sem, 1, device_id=(right,), device_id_type=pl.DeviceIdType.MESH)
    pl.semaphore_wait(sem, BARRIER_SIGNALS)


def allreduce_kernel(x_ref, o_ref, carry, recv, send_sem, recv_sem, free_sem):
    me = lax.axis_index("x")
    right = lax.rem(me + 1, NUM_DEVICES)
    left = lax.rem(me - 1 + NUM_DEVICES, NUM_DEVICES)
    o_ref[...] = x_ref[...]
    carry[...] = x_ref[...]

    def step(_, c):
        # Our receive buffer is free (its last contents were consumed below).
        pl.semaphore_signal(free_sem, 1, device_id=(left,), device_id_type=pl.DeviceIdType.MESH)
        pl.semaphore_wait(free_sem, 1)  # the right neighbour's buffer is free
        copy = pltpu.make_async_remote_copy(
            src_ref=carry, dst_ref=recv, send_sem=send_sem, recv_sem=recv_sem,
            device_id=(right,), device_id_type=pl.DeviceIdType.MESH)
        copy.start()
        copy.wait()  # our carry has left; the left neighbour's has arrived in `recv`
        o_ref[...] += recv[...]
        carry[...] = recv[...]
        return c

    lax.fori_loop(0, NUM_DEVICES - 1, step, 0)
    pl.run_scoped(functools.partial(double_barrier, left=left, right=right),
                  pltpu.SemaphoreType.REGULAR)


def allreduce(x):  # x: this device's block
    return pl.pallas_call(
        allreduce_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM(x.shape, x.dtype), pltpu.VMEM(x.shape, x.dtype),
                        pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA,
                        pltpu.SemaphoreType.REGULAR],
    )(x)


if __name__ == "__main__":
    mesh = jax.make_mesh((NUM_DEVICES,), ("x",))
    x = jnp.arange(NUM_DEVICES * 8 * 128, dtype=jnp.float32).reshape(NUM_DEVICES * 8, 128)
    x = jax.device_put(x, NamedSharding(mesh, P("x")))
    f = jax.jit(jax.shard_map(allreduce, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                              check_vma=False))
    out = f(x)
    total = np.asarray(x).reshape(NUM_DEVICES, 8, 128).sum(axis=0)
    # The bug may or may not corrupt the output, depending on the interleaving.
    print("ring_allreduce_bug: output " + ("matches" if np.allclose(out, np.tile(
        total, (NUM_DEVICES, 1))) else "is wrong"))
