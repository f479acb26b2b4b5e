"""A reduction whose reduction axis is outer: every output block is visited once per pass,
and written only on the last pass, from partial sums kept in per-block scratch.

Grid (K, N): pass k adds x's k-th column block into row block n's partial sum in
`acc_ref[n]`; the output index_map lambda k, n: (n, 0) returns to each block on every
pass. Only the last pass writes o_ref, and it writes every element, so each block's last
write-back (which lands last on a TPU) carries the full sum: nothing written on an earlier
visit is lost, and pallas-check reports nothing. (output_revisited_bug.py loses half a
block because its last visit does not rewrite it.)

Run: pallas-check run samples/output_revisited_ok.py --races
Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

K, N = 3, 2  # reduction passes, output row blocks


def outer_reduction_kernel(x_ref, o_ref, acc_ref):
    k, n = pl.program_id(0), pl.program_id(1)

    @pl.when(k == 0)
    def _():
        acc_ref[n] = jnp.zeros(acc_ref.shape[1:], acc_ref.dtype)

    acc_ref[n] += x_ref[...]

    @pl.when(k == K - 1)
    def _():
        o_ref[...] = acc_ref[n]


def outer_reduction(x):
    return pl.pallas_call(
        outer_reduction_kernel,
        grid=(K, N),
        in_specs=[pl.BlockSpec((8, 128), lambda k, n: (n, k))],
        out_specs=pl.BlockSpec((8, 128), lambda k, n: (n, 0)),
        out_shape=jax.ShapeDtypeStruct((N * 8, 128), x.dtype),
        scratch_shapes=[pltpu.VMEM((N, 8, 128), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary", "arbitrary")),
    )(x)


if __name__ == "__main__":
    x = jnp.arange(N * 8 * K * 128, dtype=jnp.float32).reshape(N * 8, K * 128)
    out = jax.jit(outer_reduction)(x)
    np.testing.assert_allclose(out, np.asarray(x).reshape(N * 8, K, 128).sum(axis=1))
    print("output_revisited_ok: output matches")
