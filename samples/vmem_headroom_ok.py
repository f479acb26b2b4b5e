"""vmem_headroom_bug.py fixed: row blocks of 768 leave the compiler room.

x (1536, 2048) @ w (2048, 1024) in two row blocks of 768: x's block double-buffered is
12 MiB, w's (constant index map: one buffer) 8 MiB, the output block double-buffered
6 MiB: 26 MiB of v6e's 32 (counting w twice would have made it 34 MiB, over the limit,
and left the call unsimulated). libtpu 0.0.42 builds it for v6e and v7x.

Run: pallas-check run samples/vmem_headroom_ok.py --tpu v6e
Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl


def matmul_kernel(x_ref, w_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)


def matmul(x, w, rows=768):
    return pl.pallas_call(
        matmul_kernel,
        grid=(x.shape[0] // rows,),
        in_specs=[pl.BlockSpec((rows, x.shape[1]), lambda i: (i, 0)),
                  pl.BlockSpec(w.shape, lambda i: (0, 0))],
        out_specs=pl.BlockSpec((rows, w.shape[1]), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), jnp.float32),
    )(x, w)


if __name__ == "__main__":
    k1, k2 = jax.random.split(jax.random.key(0))
    x = jax.random.normal(k1, (1536, 2048), jnp.float32)
    w = jax.random.normal(k2, (2048, 1024), jnp.float32)
    # At the default precision a TPU rounds the operands of a float32 product to bfloat16,
    # in the kernel and in this program's jnp.dot alike: compare like with like.
    expected = jax.jit(jnp.dot)(x, w)
    np.testing.assert_allclose(jax.jit(matmul)(x, w), expected, rtol=1e-3, atol=1e-2)
    print("vmem_headroom_ok: output matches")
