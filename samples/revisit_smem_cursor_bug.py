"""A group combine whose lost revisit is masked by a cursor carried in SMEM scratch.

Each grid step takes one tile of 8 tokens and adds it, scaled by the tile's position in
the token stream (a cursor kept in SMEM scratch, advanced by the group's size read from
an SMEM BlockSpec input), into its group's output block. The kernel zeroes the block
whenever the tile's group differs from the previous tile's, right for tiles sorted by
group; these arrive in group order 0, 1, 0, 1. At step 2 the kernel zeroes group 0's
block again and its write-back, which lands last, overwrites the block step 0 wrote:
tile 0's contribution is lost. (Changing the group sizes moves the cursor and so what
step 2 adds, but nothing of tile 0 reaches the block.)

Expected finding: kind=output-revisited buffer=o_ref range=[0:8, 0:128] line=54
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

GROUPS = np.array([0, 1, 0, 1], np.int32)  # the group of each token tile, unsorted
SIZES = np.array([3, 5], np.int32)  # tokens per group, advancing the cursor
NUM_GROUPS = 2


def combine_kernel(group_ref, sizes_ref, x_ref, o_ref, cursor_ref):
    i = pl.program_id(0)

    @pl.when(i == 0)
    def _():
        cursor_ref[0] = 0

    new_group = jnp.logical_or(i == 0, group_ref[i] != group_ref[jnp.maximum(i - 1, 0)])

    @pl.when(new_group)  # BUG: assumes the tiles are sorted by group
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    start = cursor_ref[0]
    o_ref[...] += x_ref[...] * (start + 1).astype(jnp.float32)
    cursor_ref[0] = start + sizes_ref[group_ref[i]]


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
            scratch_shapes=[pltpu.SMEM((1,), jnp.int32)],
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
    print("revisit_smem_cursor_bug: output", "matches" if np.allclose(out, reference(x),
                                                                    rtol=1e-5) else "is wrong")
