"""Explicit MXU operations (TPU v7) that leave an RHS staged when the kernel ends.

The kernel of mxu_explicit_ok.py -- y = x @ w over four grid steps along the contraction,
rows 0-31 on MXU 0 and rows 32-63 on MXU 1, the RHS double-buffered in the two staging
registers -- with the push of the next block made unconditional and its index clamped,
`jnp.minimum(k + 1, nk - 1)`, the way an index map clamps a prefetch. At the last step
(k = 3) it pushes block 3 again into staging register 0 of both MXUs, and no
matmul_acc_lhs loads it. The output is right; but JAX requires a kernel to leave no data
in the staging registers ("The kernel must not leave any data in the staging registers
upon exit"): the next kernel on these MXUs finds register 0 full. The compiler does not
see it (the push is in a loop of grid steps). pallas-check reports each MXU's register at
the push, as the kernel ends (a staging register has no index range).

Run: pallas-check run samples/mxu_explicit_bug.py --tpu v7x
Expected finding: kind=mxu-misuse buffer=MXU 0 staging register 0 line=46 args=--tpu v7x
Expected finding: kind=mxu-misuse buffer=MXU 1 staging register 0 line=46 args=--tpu v7x
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
            following = jnp.minimum(k + 1, nk - 1)  # BUG: the last step has no next block
            for mxu in range(2):  # the next block, while this one multiplies
                pltpu.matmul_push_rhs(w_ref[pl.ds(following * BLOCK, BLOCK), :],
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
    print("mxu_explicit_bug: output matches")
