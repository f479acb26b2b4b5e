"""An output block revisited out of order, kept by `pl.Buffered(1, revisit=pl.RevisitMode.ANY)`.

Token tiles arrive in an order that is not sorted by group (groups 0, 1, 0, 1), and each
tile is added into its group's output block, which the kernel reads back (`o_ref[...] +=`)
on every visit after the first. A TPU pipeline does not read an output block back in by
default: a revisit after other blocks would start from whatever its VMEM buffer held.
`revisit=pl.RevisitMode.ANY` (single buffering only) makes the pipeline insert the DMA
that restores the block from HBM when it is visited again, so the running sum is right.
(revisit_any_bug.py forgets the mode.)

Run: pallas-check run samples/revisit_any_ok.py --races
Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

GROUPS = np.array([0, 1, 0, 1], np.int32)  # the group of each token tile, unsorted


def add_into_group_kernel(group_ref, first_ref, x_ref, o_ref):
    i = pl.program_id(0)

    @pl.when(first_ref[i] == 1)
    def _():
        o_ref[...] = x_ref[...]

    @pl.when(first_ref[i] == 0)
    def _():
        o_ref[...] += x_ref[...]  # the block as the previous visit left it


def add_into_groups(x, groups, first):
    tiles = x.shape[0] // 8
    return pl.pallas_call(
        add_into_group_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(tiles,),
            in_specs=[pl.BlockSpec((8, 128), lambda i, g, f: (i, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i, g, f: (g[i], 0),
                                   pipeline_mode=pl.Buffered(1, revisit=pl.RevisitMode.ANY)),
        ),
        out_shape=jax.ShapeDtypeStruct((2 * 8, 128), x.dtype),
    )(groups, first, x)


def first_of_group(groups):
    seen, first = set(), []
    for g in groups.tolist():
        first.append(int(g not in seen))
        seen.add(g)
    return np.array(first, np.int32)


if __name__ == "__main__":
    x = jnp.arange(len(GROUPS) * 8 * 128, dtype=jnp.float32).reshape(-1, 128)
    out = jax.jit(add_into_groups)(x, jnp.asarray(GROUPS), jnp.asarray(first_of_group(GROUPS)))
    tiles = np.asarray(x).reshape(len(GROUPS), 8, 128)
    expected = np.concatenate([tiles[GROUPS == g].sum(axis=0) for g in range(2)])
    np.testing.assert_allclose(out, expected)
    print("revisit_any_ok: output matches")
