"""The fix of remote_deadlock_bug.py: each device signals its peer's barrier semaphore
first and only then waits for the peer's signal on its own.

Run: pallas-check run samples/remote_deadlock_ok.py --devices 2 --races
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


def handshake_kernel(x_ref, o_ref):
    me = lax.axis_index("x")
    peer = lax.rem(me + 1, NUM_DEVICES)
    barrier = pltpu.get_barrier_semaphore()
    pl.semaphore_signal(barrier, device_id=(peer,), device_id_type=pl.DeviceIdType.MESH)
    pl.semaphore_wait(barrier, 1)
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
    np.testing.assert_allclose(out, np.asarray(x) + 1.0)
    print("remote_deadlock_ok: output matches")


if __name__ == "__main__":
    main()
