"""A matmul whose blocks fill v6e's 32 MiB of scoped VMEM exactly: nothing is left for the
compiler's own scratch.

x (2048, 2048) @ w (2048, 1024) in two row blocks of 1024: x's block is 8 MiB,
double-buffered 16 MiB; w's index map is constant over the grid, so it is fetched once
into one 8 MiB buffer; the (1024, 1024) output block is 4 MiB, double-buffered 8 MiB.
32.00 MiB in all, exactly the limit, but Mosaic needs internal scratch for the 4 MiB
matmul result on top (libtpu 0.0.42: E1001 on v6e; v7x builds it): the kernel does
not build for v6e.
pallas-check reports it at the limit (and simulates it); `--compile --tpu v6e` reports
the compiler's E1001.

Expected finding: kind=vmem-exceeded buffer=x_ref line=28 args=--tpu v6e
Expected finding: kind=vmem-exceeded buffer=x_ref line=28 generation=v6e args=--compile --tpu v6e
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl


def matmul_kernel(x_ref, w_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)


def matmul(x, w, rows=1024):  # BUG: row blocks this tall leave the compiler no room
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
    x = jax.random.normal(k1, (2048, 2048), jnp.float32)
    w = jax.random.normal(k2, (2048, 1024), jnp.float32)
    out = jax.jit(matmul)(x, w)
    print("vmem_headroom_bug: out[0, :2] =", np.asarray(out)[0, :2])
