"""A kernel mapped with `jax.vmap` whose (4, 128) f32 blocks break the 8 x 128 rule: the
batched call is refused as the unbatched one would be.

Raises: ValueError
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def double_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0


def double(x):
    return pl.pallas_call(  # REFUSED
        double_kernel, grid=(x.shape[0] // 4,),
        in_specs=[pl.BlockSpec((4, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((4, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


if __name__ == "__main__":
    try:
        jax.jit(jax.vmap(double))(jnp.ones((3, 16, 128), jnp.float32))
    except Exception as exc:
        print("raised", type(exc).__name__)
        raise
