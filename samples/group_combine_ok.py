"""An MoE-style group combine over token tiles that are not sorted by group.

Each grid step takes one tile of 8 tokens, projects it with its group's weights and adds
the result into the group's output block; the tiles arrive in group order 0, 1, 0, 1, so
each output block is visited, left for the other group, and visited again. A TPU pipeline
never reads an output block back: the running sum lives in a VMEM scratch per group
(zeroed at the group's first tile) and is written out whole at every visit, so the last
visit's write-back, which lands last, carries every tile's contribution.
(group_combine_bug.py keeps the sum in the output block and restarts it at every run of
a group, which is right only for sorted groups.)

Run: pallas-check run samples/group_combine_ok.py --races
Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

GROUPS = np.array([0, 1, 0, 1], np.int32)  # the group of each token tile, unsorted
NUM_GROUPS = 2


def group_combine_kernel(group_ref, first_ref, x_ref, w_ref, o_ref, acc_ref):
    i = pl.program_id(0)
    g = group_ref[i]

    @pl.when(first_ref[i] == 1)
    def _():
        acc_ref[g] = jnp.zeros(acc_ref.shape[1:], acc_ref.dtype)

    acc_ref[g] += jnp.dot(x_ref[...], w_ref[...], precision="highest")
    o_ref[...] = acc_ref[g]


def group_combine(x, w, groups, first):
    tiles = x.shape[0] // 8
    return pl.pallas_call(
        group_combine_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(tiles,),
            in_specs=[pl.BlockSpec((8, 128), lambda i, g, f: (i, 0)),
                      pl.BlockSpec((None, 128, 128), lambda i, g, f: (g[i], 0, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i, g, f: (g[i], 0)),
            scratch_shapes=[pltpu.VMEM((NUM_GROUPS, 8, 128), jnp.float32)],
        ),
        out_shape=jax.ShapeDtypeStruct((NUM_GROUPS * 8, 128), jnp.float32),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
    )(groups, first, x, w)


def first_of_group(groups):
    seen, first = set(), []
    for g in groups.tolist():
        first.append(int(g not in seen))
        seen.add(g)
    return np.array(first, np.int32)


def reference(x, w):
    tiles = np.asarray(x).reshape(len(GROUPS), 8, 128)
    w = np.asarray(w)
    return np.concatenate([sum(tiles[i] @ w[g] for i in np.nonzero(GROUPS == g)[0])
                           for g in range(NUM_GROUPS)])


if __name__ == "__main__":
    kx, kw = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (len(GROUPS) * 8, 128), jnp.float32)
    w = jax.random.normal(kw, (NUM_GROUPS, 128, 128), jnp.float32)
    out = jax.jit(group_combine)(x, w, jnp.asarray(GROUPS), jnp.asarray(first_of_group(GROUPS)))
    np.testing.assert_allclose(out, reference(x, w), rtol=1e-4, atol=1e-3)
    print("group_combine_ok: output matches")
