"""A cross-device handshake in which each device waits before it signals: 2 devices hang.

Each device is meant to tell its peer "I am here" by signalling the peer's barrier
semaphore, then wait for the peer's "I am here" on its own. The two lines are in the
wrong order: both devices wait first, and the only signal that could wake each one comes
from the other after its own wait. On a TPU both devices hang; pallas-check reports
a deadlock naming both blocked devices instead.

Run: pallas-check run samples/remote_deadlock_bug.py --devices 2
Expected finding: kind=deadlock buffer=barrier_semaphore line=32 args=--devices 2
(no range: a barrier semaphore is a single semaphore; line 32 is the wait both devices
block in)
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


def handshake_kernel(x_ref, o_ref):
    me = lax.axis_index("x")
    peer = lax.rem(me + 1, NUM_DEVICES)
    barrier = pltpu.get_barrier_semaphore()
    # BUG: wait for the peer's signal before sending ours; the peer does the same.
    pl.semaphore_wait(barrier, 1)
    pl.semaphore_signal(barrier, device_id=(peer,), device_id_type=pl.DeviceIdType.MESH)
    o_ref[...] = x_ref[...] + 1.0


def handshake(x):
    return pl.pallas_call(
        handshake_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec((8, 128), lambda: (0, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda: (0, 0)),
        compiler_params=pltpu.CompilerParams(collective_id=0),
    )(x)


def main():
    mesh = jax.make_mesh((NUM_DEVICES,), ("x",))
    x = jnp.arange(NUM_DEVICES * 8 * 128, dtype=jnp.float32).reshape(NUM_DEVICES * 8, 128)
    x = jax.device_put(x, NamedSharding(mesh, P("x")))
    f = jax.jit(jax.shard_map(handshake, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                              check_vma=False))
    out = np.asarray(f(x))
    print("remote_deadlock_bug: out[0, :4] =", out[0, :4])


if __name__ == "__main__":
    main()
