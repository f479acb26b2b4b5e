"""A primitive the Pallas TPU lowering cannot lower: `jnp.sort` inside a kernel.

The kernel takes each row's maximum as the last element of the sorted row. It computes
the right values anywhere a sort exists (the simulation, JAX's interpreters), but Mosaic
has no sort: `--compile` reports the line of the sort.

Expected finding: kind=compile-error buffer= line=17 generation=v6e args=--compile --tpu v6e
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl


def row_max_kernel(x_ref, o_ref):
    ordered = jnp.sort(x_ref[...], axis=-1)  # BUG: no sort in Pallas TPU
    o_ref[...] = jnp.broadcast_to(ordered[:, -1:], o_ref.shape)


def row_max(x):
    return pl.pallas_call(
        row_max_kernel,
        grid=(x.shape[0] // 8,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)


if __name__ == "__main__":
    x = jax.random.normal(jax.random.key(0), (16, 128), jnp.float32)
    expected = jnp.broadcast_to(x.max(axis=-1, keepdims=True), x.shape)
    np.testing.assert_allclose(jax.jit(row_max)(x), expected)
    print("compile_primitive_bug: output matches")
