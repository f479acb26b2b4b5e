"""vmem_gather_bug.py fixed: the row ids are scalar-prefetched into SMEM and each row is
copied by a load at a dynamic scalar row index (`pl.ds(ids_ref[r], 1)`), which Mosaic
lowers.

Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

ROWS, WIDTH, PICKS = 64, 128, 8


def lookup_kernel(ids_ref, table_ref, o_ref):
    @pl.loop(0, PICKS)
    def _(r):
        o_ref[pl.ds(r, 1), :] = table_ref[pl.ds(ids_ref[r], 1), :]


def lookup(ids, table):
    return pl.pallas_call(
        lookup_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(1,),
            in_specs=[pl.BlockSpec((ROWS, WIDTH), lambda i, ids: (0, 0))],
            out_specs=pl.BlockSpec((PICKS, WIDTH), lambda i, ids: (0, 0))),
        out_shape=jax.ShapeDtypeStruct((PICKS, WIDTH), table.dtype),
    )(ids, table)


if __name__ == "__main__":
    table = jnp.arange(ROWS * WIDTH, dtype=jnp.float32).reshape(ROWS, WIDTH)
    ids = jnp.array([3, 17, 0, 63, 5, 5, 42, 8], jnp.int32)
    out = jax.jit(lookup)(ids, table)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(table)[np.asarray(ids)])
    print("vmem_gather_ok: output matches")
