"""A matrix product driven through the MXUs by hand (`pltpu.matmul_push_rhs`,
`pltpu.matmul_acc_lhs`, `pltpu.matmul_pop`), which Mosaic accepts from TPU v7 on.

y = x @ w with x (64, 1024) and w (1024, 256) in bfloat16, over a grid of four steps along
the contraction: step k multiplies x's columns [256k, 256k + 256) by w's rows of the same
range. Rows 0-31 go through MXU 0 and rows 32-63 through MXU 1, each accumulating at
address 0 of its own accumulator across the steps; the last step pops both (float32) into
the output. The RHS is double-buffered: while step k multiplies the block staged in
register k % 2, the kernel pushes block k + 1 into the other register -- except at the
last step, which has no next block. (The bug twin pushes a clamped "next" block there, and
leaves it staged when the kernel ends.) The script checks y against numpy's float64
product of the same bfloat16 values (the MXU's products are exact in float32).

Run: pallas-check run samples/mxu_explicit_ok.py --tpu v7x
Expected findings: none.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

M, K, N = 64, 1024, 256
BLOCK = 256  # the MXU's RHS is 256 x 256 on v7x
ROWS = M // 2  # per MXU


def mxu_kernel(x_ref, w_ref, o_ref, *, nk):
    k = pl.program_id(0)

    @pl.when(k == 0)
    def _():
        for mxu in range(2):
            pltpu.matmul_push_rhs(w_ref[pl.ds(0, BLOCK), :], staging_register=0,
                                  mxu_index=mxu)

    for parity in range(2):
        @pl.when(k % 2 == parity)
        def _():
            @pl.when(k + 1 < nk)
            def _():
                for mxu in range(2):  # the next block, while this one multiplies
                    pltpu.matmul_push_rhs(w_ref[pl.ds((k + 1) * BLOCK, BLOCK), :],
                                          staging_register=1 - parity, mxu_index=mxu)

            for mxu in range(2):
                pltpu.matmul_acc_lhs(0, x_ref[pl.ds(mxu * ROWS, ROWS), :], mxu_index=mxu,
                                     load_staged_rhs=parity)

    @pl.when(k == nk - 1)
    def _():
        for mxu in range(2):
            o_ref[pl.ds(mxu * ROWS, ROWS), :] = pltpu.matmul_pop(0, (ROWS, N), jnp.float32,
                                                                 mxu)


def matmul(x, w):
    nk = x.shape[1] // BLOCK
    return pl.pallas_call(
        functools.partial(mxu_kernel, nk=nk),
        grid=(nk,),
        in_specs=[pl.BlockSpec((M, BLOCK), lambda k: (0, k)),
                  pl.BlockSpec(memory_space=pltpu.VMEM)],
        out_specs=pl.BlockSpec((M, N), lambda k: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((M, N), jnp.float32),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
    )(x, w)


if __name__ == "__main__":
    rng = np.random.default_rng(7)
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((K, N)), jnp.bfloat16)
    y = np.asarray(jax.jit(matmul)(x, w))
    want = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-4)
    print("mxu_explicit_ok: output matches")
