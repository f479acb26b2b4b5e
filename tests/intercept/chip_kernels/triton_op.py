"""A Triton-only op in a TPU kernel: `pltriton.approx_tanh` (inline PTX), which the Pallas
TPU lowering cannot lower.

Raises: NotImplementedError
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton


def tanh_kernel(x_ref, o_ref):
    o_ref[...] = pltriton.approx_tanh(x_ref[...])  # REFUSED


def fast_tanh(x):
    return pl.pallas_call(tanh_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


if __name__ == "__main__":
    try:
        jax.jit(fast_tanh)(jnp.ones((8, 128), jnp.float32))
    except Exception as exc:
        print("raised", type(exc).__name__)
        raise
