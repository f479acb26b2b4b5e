"""revisit_smem_cursor_bug.py fixed: the group sums live in VMEM scratch, and every
visit writes its group's running sum to the output block.

The tiles still arrive in group order 0, 1, 0, 1, the position cursor still lives in
SMEM scratch and advances by the group sizes of an SMEM BlockSpec input; each group's
block is visited twice, and its last visit writes back the whole sum, tile 0's share
included.

Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

GROUPS = np.array([0, 1, 0, 1], np.int32)  # the group of each token tile, unsorted
SIZES = np.array([3, 5], np.int32)  # tokens per group, advancing the cursor
NUM_GROUPS = 2


def combine_kernel(group_ref, sizes_ref, x_ref, o_ref, cursor_ref, acc_ref):
    i = pl.program_id(0)
    g = group_ref[i]

    @pl.when(i == 0)
    def _():
        cursor_ref[0] = 0
        acc_ref[...] = jnp.zeros_like(acc_ref)

    start = cursor_ref[0]
    acc_ref[g] += x_ref[...] * (start + 1).astype(jnp.float32)
    o_ref[...] = acc_ref[g]
    cursor_ref[0] = start + sizes_ref[g]


def combine(x, sizes, groups):
    tiles = x.shape[0] // 8
    return pl.pallas_call(
        combine_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(tiles,),
            in_specs=[pl.BlockSpec((NUM_GROUPS,), lambda i, g: (0,),
                                   memory_space=pltpu.SMEM),
                      pl.BlockSpec((8, 128), lambda i, g: (i, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i, g: (g[i], 0)),
            scratch_shapes=[pltpu.SMEM((1,), jnp.int32),
                            pltpu.VMEM((NUM_GROUPS, 8, 128), jnp.float32)],
        ),
        out_shape=jax.ShapeDtypeStruct((NUM_GROUPS * 8, 128), jnp.float32),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
    )(groups, sizes, x)


def reference(x):
    tiles = np.asarray(x).reshape(len(GROUPS), 8, 128)
    starts = np.concatenate([[0], np.cumsum(SIZES[GROUPS])[:-1]])
    return np.concatenate([sum(tiles[i] * (starts[i] + 1) for i in np.nonzero(GROUPS == g)[0])
                           for g in range(NUM_GROUPS)])


if __name__ == "__main__":
    x = jax.random.normal(jax.random.key(0), (len(GROUPS) * 8, 128), jnp.float32)
    out = jax.jit(combine)(x, jnp.asarray(SIZES), jnp.asarray(GROUPS))
    # The reference is float64 (`starts` are int64), the kernel float32: where a group's
    # terms nearly cancel, one rounding is a large relative error (a v5e's inputs made two
    # elements of 2048 miss rtol alone by 5e-5), hence atol too.
    np.testing.assert_allclose(out, reference(x), rtol=1e-5, atol=1e-5)
    print("revisit_smem_cursor_ok: output matches")
