"""A block that fits v6e's scoped VMEM and overflows v5e's: one (2048, 2048) f32 output.

x @ y.T of two (2048, 128) matrices in a single grid step: the output block alone is
16 MiB, v5e's whole default scoped VMEM (v6e's is 32 MiB). The kernel builds for v6e
and not for v5e (E1001); `--compile --tpu v5e,v6e` reports the v5e overflow at the
pallas_call, naming the largest allocation, and nothing for v6e.

Expected finding: kind=vmem-exceeded buffer=o_ref line=24 generation=v5e args=--compile --tpu v5e,v6e
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl


def gram_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = jax.lax.dot_general(x_ref[...], y_ref[...], (((1,), (1,)), ((), ())),
                                     precision="highest")


def gram(x, y):
    n = x.shape[0]  # BUG: the whole (n, n) output as one block
    return pl.pallas_call(
        gram_kernel,
        grid=(1,),
        in_specs=[pl.BlockSpec((n, 128), lambda i: (0, 0))] * 2,
        out_specs=pl.BlockSpec((n, n), lambda i: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((n, n), jnp.float32),
    )(x, y)


if __name__ == "__main__":
    k1, k2 = jax.random.split(jax.random.key(0))
    x = jax.random.normal(k1, (2048, 128), jnp.float32)
    y = jax.random.normal(k2, (2048, 128), jnp.float32)
    expected = jnp.dot(x, y.T, precision=jax.lax.Precision.HIGHEST)
    np.testing.assert_allclose(jax.jit(gram)(x, y), expected, rtol=1e-4, atol=1e-3)
    print("compile_vmem_bug: output matches")
