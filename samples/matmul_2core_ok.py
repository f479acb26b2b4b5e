"""A correct blocked matmul split over two TensorCores.

The grid is (i, j, k): output block rows i and columns j are independent ("parallel",
so a megacore TPU splits them over its cores), the reduction k is sequential
("arbitrary") and accumulates in a VMEM scratch that each core has its own copy of.
Every output block is written back by exactly one core, once its k loop ends.

For a megacore chip (v4, v5p: two TensorCores per device, `--cores 2`); right on a
one-TensorCore device too.

Run: pallas-check run samples/matmul_2core_ok.py --tpu v5p --cores 2 --races
Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BM = BN = BK = 128


def matmul_kernel(x_ref, y_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], precision="highest")

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def matmul(x, y):
    m, k = x.shape
    _, n = y.shape
    return pl.pallas_call(
        matmul_kernel,
        grid=(m // BM, n // BN, k // BK),
        in_specs=[pl.BlockSpec((BM, BK), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((BK, BN), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((BM, BN), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        scratch_shapes=[pltpu.VMEM((BM, BN), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(x, y)


if __name__ == "__main__":
    kx, ky = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (256, 384), jnp.float32)
    y = jax.random.normal(ky, (384, 256), jnp.float32)
    out = jax.jit(matmul)(x, y)
    expected = jnp.dot(x, y, precision=jax.lax.Precision.HIGHEST)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
    print("matmul_2core_ok: output matches")
