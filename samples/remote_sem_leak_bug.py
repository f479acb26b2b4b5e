"""A remote semaphore signal that its target never waits for, on 2 devices.

Each device scales its block, then tells its right neighbour "my block is done" by
signalling the neighbour's `done_sem` (a REGULAR semaphore) over the interconnect. No
device ever waits on its own `done_sem`, so on every device it ends the kernel with
count 1: on a TPU a semaphore left non-zero at kernel exit is an error, and a later
kernel reusing it would see the stale count.

Run: pallas-check run samples/remote_sem_leak_bug.py --devices 2
Expected finding: kind=semaphore-leak buffer=done_sem line=38 args=--devices 2
(no range: done_sem is a single semaphore, not an array; line 38 is the remote signal)
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


def scale_kernel(x_ref, o_ref, done_sem):
    me = lax.axis_index("x")
    right = lax.rem(me + 1, NUM_DEVICES)
    left = lax.rem(me + NUM_DEVICES - 1, NUM_DEVICES)
    # Handshake: the neighbours are in this kernel (their semaphores exist) before we
    # signal one of them.
    barrier = pltpu.get_barrier_semaphore()
    pl.semaphore_signal(barrier, device_id=(left,), device_id_type=pl.DeviceIdType.MESH)
    pl.semaphore_signal(barrier, device_id=(right,), device_id_type=pl.DeviceIdType.MESH)
    pl.semaphore_wait(barrier, 2)
    o_ref[...] = x_ref[...] * 2.0
    # BUG: the right neighbour never waits on its done_sem for this signal.
    pl.semaphore_signal(done_sem, device_id=(right,), device_id_type=pl.DeviceIdType.MESH)


def scale(x):
    return pl.pallas_call(
        scale_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec((8, 128), lambda: (0, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda: (0, 0)),
        scratch_shapes=[pltpu.SemaphoreType.REGULAR],
        compiler_params=pltpu.CompilerParams(collective_id=0),
    )(x)


def main():
    mesh = jax.make_mesh((NUM_DEVICES,), ("x",))
    x = jnp.arange(NUM_DEVICES * 8 * 128, dtype=jnp.float32).reshape(NUM_DEVICES * 8, 128)
    x = jax.device_put(x, NamedSharding(mesh, P("x")))
    f = jax.jit(jax.shard_map(scale, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                              check_vma=False))
    out = np.asarray(f(x))
    print("remote_sem_leak_bug: output", "matches" if np.allclose(out, 2.0 * x) else "is wrong")


if __name__ == "__main__":
    main()
