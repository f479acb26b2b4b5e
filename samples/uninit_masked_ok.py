"""A masked read-modify-write whose never-written elements are masked away: correct.

The kernel fills its output block in two passes, even columns then odd columns, each
with `o_ref[...] = jnp.where(mask, new, o_ref[...])`. The first pass reads the output
block before anything was written to it, but every element it keeps from that read is
overwritten by the second pass, so no output depends on never-written memory.
Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl


def interleave_kernel(a_ref, b_ref, o_ref):
    even = lax.broadcasted_iota(jnp.int32, o_ref.shape, 1) % 2 == 0
    o_ref[...] = jnp.where(even, a_ref[...], o_ref[...])
    o_ref[...] = jnp.where(even, o_ref[...], b_ref[...])


def interleave(a, b):
    return pl.pallas_call(
        interleave_kernel,
        grid=(a.shape[0] // 8,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))] * 2,
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype),
    )(a, b)


if __name__ == "__main__":
    a = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
    b = -a
    out = jax.jit(interleave)(a, b)
    even = (jnp.arange(128) % 2 == 0)[None, :]
    np.testing.assert_allclose(out, jnp.where(even, a, b))
    print("uninit_masked_ok: output matches")
