"""A bidirectional ring reduce-scatter whose left-going ring skips the "buffer free"
handshake.

The same kernel as reduce_scatter_ok.py without the signal and wait on `free_l`: a device
may send its next partial sum into the left neighbour's `recv_l` while that neighbour is
still reading the previous one.

Run: pallas-check run samples/reduce_scatter_bug.py --devices 4 --races
Expected finding: kind=race buffer=recv_l range=[0:4, 0:128] line=57 args=--devices 4 --races
(line 57 starts the left-going copy, which lands in recv_l while the neighbour reads it)
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

N = 4  # devices, and chunks per device
ROWS, HALF = 8, 4
MESH_ID = pl.DeviceIdType.MESH


def double_barrier(sem, left, right):
    pl.semaphore_signal(sem, 1, device_id=(left,), device_id_type=MESH_ID)
    pl.semaphore_signal(sem, 1, device_id=(right,), device_id_type=MESH_ID)
    pl.semaphore_wait(sem, 2)


def reduce_scatter_kernel(x_ref, o_ref, acc_r, recv_r, acc_l, recv_l, dma_sems,
                          free_r, free_l):
    me = lax.axis_index("x")
    right, left = lax.rem(me + 1, N), lax.rem(me + N - 1, N)

    def rows(chunk, half):  # this device's rows of one half of a chunk
        return x_ref[pl.ds(chunk * ROWS + half * HALF, HALF), :]

    acc_r[...] = rows(lax.rem(me + N - 1, N), 0)
    acc_l[...] = rows(lax.rem(me + 1, N), 1)

    def step(s, carry):
        # Our receive buffers are free: tell the neighbours that write into them.
        pl.semaphore_signal(free_r, 1, device_id=(left,), device_id_type=MESH_ID)
        pl.semaphore_wait(free_r, 1)  # the right neighbour's recv_r is free
        to_right = pltpu.make_async_remote_copy(
            src_ref=acc_r, dst_ref=recv_r, send_sem=dma_sems.at[0], recv_sem=dma_sems.at[1],
            device_id=(right,), device_id_type=MESH_ID)
        to_left = pltpu.make_async_remote_copy(
            src_ref=acc_l, dst_ref=recv_l, send_sem=dma_sems.at[2], recv_sem=dma_sems.at[3],
            device_id=(left,), device_id_type=MESH_ID)
        to_right.start()
        to_left.start()
        to_right.wait()
        to_left.wait()
        acc_r[...] = recv_r[...] + rows(lax.rem(me + 2 * N - s - 2, N), 0)
        acc_l[...] = recv_l[...] + rows(lax.rem(me + s + 2, N), 1)
        return carry

    lax.fori_loop(0, N - 1, step, 0)
    o_ref[pl.ds(0, HALF), :] = acc_r[...]
    o_ref[pl.ds(HALF, HALF), :] = acc_l[...]
    pl.run_scoped(functools.partial(double_barrier, left=left, right=right),
                  pltpu.SemaphoreType.REGULAR)


def reduce_scatter(x):  # x: this device's (N * 8, 128)
    half = pltpu.VMEM((HALF, x.shape[1]), x.dtype)
    return pl.pallas_call(
        reduce_scatter_kernel,
        out_shape=jax.ShapeDtypeStruct((ROWS, x.shape[1]), x.dtype),
        scratch_shapes=[half, half, half, half, pltpu.SemaphoreType.DMA((4,)),
                        pltpu.SemaphoreType.REGULAR, pltpu.SemaphoreType.REGULAR],
    )(x)


if __name__ == "__main__":
    mesh = jax.make_mesh((N,), ("x",))
    x = jnp.arange(N * N * ROWS * 128, dtype=jnp.float32).reshape(N * N * ROWS, 128) / 7
    x = jax.device_put(x, NamedSharding(mesh, P("x")))
    f = jax.jit(jax.shard_map(reduce_scatter, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                              check_vma=False))
    out = f(x)
    per_device = np.asarray(x).reshape(N, N, ROWS, 128)  # [device, chunk, rows, lanes]
    expected = per_device.sum(axis=0).reshape(N * ROWS, 128)  # device d gets chunk d
    # The race may or may not corrupt the output (it depends on which copy lands first).
    print("reduce_scatter_bug: output " + ("matches" if np.allclose(out, expected, rtol=1e-5)
                                           else "is wrong"))
