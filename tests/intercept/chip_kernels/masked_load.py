"""A masked `pltpu.load`: the Pallas TPU lowering has no masked vector load (it raises
NotImplementedError without a message).

Raises: NotImplementedError
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def half_kernel(x_ref, o_ref):
    lanes = jax.lax.broadcasted_iota(jnp.int32, x_ref.shape, 1)
    o_ref[...] = pltpu.load(x_ref, mask=lanes < 64)


def half(x):
    return pl.pallas_call(  # REFUSED: the call's line (the lowering names no operation)
        half_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


if __name__ == "__main__":
    try:
        jax.jit(half)(jnp.ones((8, 128), jnp.float32))
    except Exception as exc:
        print("raised", type(exc).__name__)
        raise
