"""A masked read-modify-write that leaves the unselected elements uninitialised.

Like uninit_masked_ok.py, but the second pass (odd columns) was dropped: the odd
columns of the output keep what `o_ref[...]` held before anything was written, i.e.
never-written VMEM, and that reaches the result.

Expected finding: kind=uninitialized buffer=o_ref range=[0:8, 0:128] line=23
(the range is the never-written part of the read `o_ref[...]`: the whole block, as
nothing was written before it; the message names the output elements that depend on
it, the odd columns, o_ref[0:16, 1:128])
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl


def interleave_kernel(a_ref, b_ref, o_ref):
    even = lax.broadcasted_iota(jnp.int32, o_ref.shape, 1) % 2 == 0
    # BUG: the odd columns are never filled from b_ref.
    o_ref[...] = jnp.where(even, a_ref[...], o_ref[...])


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
    print("uninit_masked_bug: out[0, :4] =", np.asarray(out)[0, :4])
