"""A tiny BlockSpec kernel called in a loop whose every output feeds the next JAX op.

Usage: kernel_loop.py N MODE [sync], MODE one of jit, eager, vmap, shard_map (2 devices),
eager-interpret (JAX's interpret=True, no pallas-check). It
checks and prints the final value of one element (each call adds 1e-3 everywhere). With
`sync` every step is waited for before the next is dispatched.
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.sharding import Mesh, PartitionSpec as P


def add_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]


def add(x, y, interpret=False):
    return pl.pallas_call(
        add_kernel, interpret=interpret,
        grid=(x.shape[0] // 8,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))] * 2,
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x, y)


def step_function(mode: str):
    if mode == "jit":
        return jax.jit(add)
    if mode == "eager":
        return add
    if mode == "eager-interpret":  # JAX's own interpreter, for the eager benchmark
        return lambda x, y: add(x, y, interpret=True)
    if mode == "vmap":
        return jax.jit(jax.vmap(add))
    if mode == "shard_map":
        mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
        return jax.jit(jax.shard_map(add, mesh=mesh, in_specs=(P("x"), P("x")),
                                     out_specs=P("x"), check_vma=False))
    raise SystemExit(f"unknown mode {mode}")


def main() -> None:
    calls, mode = int(sys.argv[1]), sys.argv[2]
    sync = sys.argv[3:] == ["sync"]
    shape = (2, 16, 128) if mode == "vmap" else (32, 128)
    x = jnp.zeros(shape, jnp.float32)
    step = step_function(mode)
    for _ in range(calls):
        x = step(x, x * 0 + 1e-3)
        if sync:
            x.block_until_ready()
    value = float(np.asarray(x).reshape(-1)[0])
    np.testing.assert_allclose(value, calls * 1e-3, rtol=1e-4)
    print(f"kernel_loop: {calls} {mode} calls, value {value:.6f}")


if __name__ == "__main__":
    main()
