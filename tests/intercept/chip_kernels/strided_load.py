"""A strided lane load (`stride=2`) from a ref 256 lanes wide: Mosaic's strided load needs
a last dimension of exactly 128 lanes.

Raises: MosaicError
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def even_lanes_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[:, pl.ds(0, 128, stride=2)]  # REFUSED


def even_lanes(x):
    return pl.pallas_call(even_lanes_kernel,
                          out_shape=jax.ShapeDtypeStruct((x.shape[0], 128), x.dtype))(x)


if __name__ == "__main__":
    try:
        even_lanes(jnp.ones((8, 256), jnp.float32))
    except Exception as exc:
        print("raised", type(exc).__name__)
        raise
