"""compile_vmem_bug.py fixed: (512, 512) output blocks over a (4, 4) grid, 1 MiB each,
double-buffered: well inside every generation's scoped VMEM.

Run: pallas-check run samples/compile_vmem_ok.py --compile --tpu v5e,v6e,v7x
Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl


def gram_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = jax.lax.dot_general(x_ref[...], y_ref[...], (((1,), (1,)), ((), ())),
                                     precision="highest")


def gram(x, y):
    n, block = x.shape[0], 512
    return pl.pallas_call(
        gram_kernel,
        grid=(n // block, n // block),
        in_specs=[pl.BlockSpec((block, 128), lambda i, j: (i, 0)),
                  pl.BlockSpec((block, 128), lambda i, j: (j, 0))],
        out_specs=pl.BlockSpec((block, block), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((n, n), jnp.float32),
    )(x, y)


if __name__ == "__main__":
    k1, k2 = jax.random.split(jax.random.key(0))
    x = jax.random.normal(k1, (2048, 128), jnp.float32)
    y = jax.random.normal(k2, (2048, 128), jnp.float32)
    expected = jnp.dot(x, y.T, precision=jax.lax.Precision.HIGHEST)
    np.testing.assert_allclose(jax.jit(gram)(x, y), expected, rtol=1e-4, atol=1e-3)
    print("compile_vmem_ok: output matches")
