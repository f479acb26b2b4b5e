"""A remote copy split across three pallas_calls on 2 devices (JAX's async remote copy).

`copy_start` sends each device's x to its right neighbour's `out` and returns the send and
receive DMA semaphores with the copy in flight; `send_done` waits for the send (x may be
reused), `recv_done` for the landing. Argument: `ok`, or `no_send_wait` / `no_recv_wait`
(that call is left out: its semaphore reaches the end of the script unwaited), or
`early_read` (`recv_done` copies `out` before it waits: a race with the landing).
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding, PartitionSpec as P

ANY = pl.BlockSpec(memory_space=pl.ANY)
SEM = pl.BlockSpec(memory_space=pltpu.SEMAPHORE)
VARIANT = sys.argv[1] if len(sys.argv) > 1 else "ok"


def start_kernel(x_ref, x_alias, o_ref, send_sem, recv_sem):
    del x_alias
    n = jax.lax.axis_size("x")
    me = jax.lax.axis_index("x")
    barrier = pltpu.get_barrier_semaphore()  # the neighbour is in this kernel too
    pl.semaphore_signal(barrier, device_id=jax.lax.rem(me - 1 + n, n))
    pl.semaphore_wait(barrier, 1)
    pltpu.make_async_remote_copy(x_ref, o_ref, send_sem, recv_sem,
                                 device_id=jax.lax.rem(me + 1, n)).start()


def send_done_kernel(x_ref, send_sem, x_alias):
    del x_alias
    pltpu.make_async_copy(x_ref, x_ref, send_sem).wait()


def recv_done_kernel(x_ref, o_ref, recv_sem, o_alias):
    del o_alias
    pltpu.make_async_copy(x_ref, o_ref, recv_sem).wait()


def early_read_kernel(x_ref, o_ref, recv_sem, o_alias, y_ref, sem):
    del o_alias
    early = pltpu.make_async_copy(o_ref, y_ref, sem)  # BUG: before the wait below
    early.start()
    early.wait()
    pltpu.make_async_copy(x_ref, o_ref, recv_sem).wait()


def shift_right(x):
    like = jax.ShapeDtypeStruct(x.shape, x.dtype)
    x, out, send_sem, recv_sem = pl.pallas_call(
        start_kernel,
        out_shape=(like, like, pltpu.SemaphoreType.DMA(()), pltpu.SemaphoreType.DMA(())),
        in_specs=[ANY], out_specs=(ANY, ANY, SEM, SEM), input_output_aliases={0: 0},
        compiler_params=pltpu.CompilerParams(collective_id=0, has_side_effects=True))(x)
    if VARIANT != "no_send_wait":
        x = pl.pallas_call(send_done_kernel, out_shape=like, in_specs=[ANY, SEM],
                           out_specs=ANY, input_output_aliases={0: 0})(x, send_sem)
    if VARIANT == "no_recv_wait":
        return out
    if VARIANT == "early_read":
        return pl.pallas_call(
            early_read_kernel, out_shape=(like, like), in_specs=[ANY, ANY, SEM],
            out_specs=(ANY, ANY), scratch_shapes=[pltpu.SemaphoreType.DMA],
            input_output_aliases={1: 0})(x, out, recv_sem)[0]
    return pl.pallas_call(recv_done_kernel, out_shape=like, in_specs=[ANY, ANY, SEM],
                          out_specs=ANY, input_output_aliases={1: 0})(x, out, recv_sem)


if __name__ == "__main__":
    mesh = jax.make_mesh((2,), ("x",))
    x = jnp.arange(2 * 8 * 128, dtype=jnp.float32).reshape(2 * 8, 128)
    x = jax.device_put(x, NamedSharding(mesh, P("x")))
    f = jax.jit(jax.shard_map(shift_right, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                              check_vma=False))
    np.testing.assert_array_equal(np.asarray(f(x)), np.roll(np.asarray(x), 8, axis=0))
    print("remote_cross_call: output matches")
