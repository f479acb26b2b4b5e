"""compile_primitive_bug.py fixed: the row maximum with `jnp.max`, a reduction Mosaic has.

Run: pallas-check run samples/compile_primitive_ok.py --compile --tpu v5e,v6e,v7x
Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl


def row_max_kernel(x_ref, o_ref):
    largest = jnp.max(x_ref[...], axis=-1, keepdims=True)
    o_ref[...] = jnp.broadcast_to(largest, o_ref.shape)


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
    print("compile_primitive_ok: output matches")
