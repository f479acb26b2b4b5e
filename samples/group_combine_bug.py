"""An MoE-style group combine that restarts a group's sum whenever the group changes.

Each grid step takes one tile of 8 tokens, projects it with its group's weights and adds
the result into the group's output block. The kernel zeroes the block whenever the tile's
group differs from the previous tile's, which is right for tiles sorted by group; these
arrive in group order 0, 1, 0, 1. At step 2 the kernel zeroes group 0's block again (on a
TPU the pipeline did not read it back; it holds nothing of step 0 anyway) and its
write-back, which lands last, overwrites the block step 0 wrote: tile 0's contribution is
silently lost, and every element of the block is written, so no read of never-written
memory shows it. (group_combine_ok.py keeps the sums in scratch.)

Expected finding: kind=output-revisited buffer=o_ref range=[0:8, 0:128] line=47
(the line is the out_specs index_map; the first visit of block (0, 0), at grid point (0,),
contributes nothing to what its last visit, at grid point (2,), writes back)
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

GROUPS = np.array([0, 1, 0, 1], np.int32)  # the group of each token tile, unsorted
NUM_GROUPS = 2


def group_combine_kernel(group_ref, x_ref, w_ref, o_ref):
    i = pl.program_id(0)
    new_group = jnp.logical_or(i == 0, group_ref[i] != group_ref[jnp.maximum(i - 1, 0)])

    @pl.when(new_group)  # BUG: assumes the tiles are sorted by group
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(x_ref[...], w_ref[...], precision="highest")


def group_combine(x, w, groups):
    tiles = x.shape[0] // 8
    return pl.pallas_call(
        group_combine_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(tiles,),
            in_specs=[pl.BlockSpec((8, 128), lambda i, g: (i, 0)),
                      pl.BlockSpec((None, 128, 128), lambda i, g: (g[i], 0, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i, g: (g[i], 0)),
        ),
        out_shape=jax.ShapeDtypeStruct((NUM_GROUPS * 8, 128), jnp.float32),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
    )(groups, x, w)


def reference(x, w):
    tiles = np.asarray(x).reshape(len(GROUPS), 8, 128)
    w = np.asarray(w)
    return np.concatenate([sum(tiles[i] @ w[g] for i in np.nonzero(GROUPS == g)[0])
                           for g in range(NUM_GROUPS)])


if __name__ == "__main__":
    kx, kw = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (len(GROUPS) * 8, 128), jnp.float32)
    w = jax.random.normal(kw, (NUM_GROUPS, 128, 128), jnp.float32)
    out = jax.jit(group_combine)(x, w, jnp.asarray(GROUPS))
    print("group_combine_bug: output", "matches" if np.allclose(out, reference(x, w),
                                                               rtol=1e-4, atol=1e-3)
          else "is wrong")
