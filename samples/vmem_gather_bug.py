"""An embedding lookup written as a gather from a VMEM ref: `table_ref[ids, :]`.

The kernel picks 8 rows of a (64, 128) table by the row ids in `ids_ref`. JAX's
interpreters evaluate the gather, but Mosaic takes only scalar and slice indices into a
ref ("Cannot do int indexing on TPU"): the kernel does not compile for a TPU. pallas-check
reports it at the line of the gather, with or without --compile, and skips the call (its
output is left never written: NaN).

Expected finding: kind=compile-error buffer=table_ref line=23
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

ROWS, WIDTH, PICKS = 64, 128, 8


def lookup_kernel(ids_ref, table_ref, o_ref):
    ids = ids_ref[...]
    # BUG: a ref indexed by an array of indices (a gather) does not lower on TPU.
    o_ref[...] = table_ref[ids, :]


def lookup(ids, table):
    return pl.pallas_call(
        lookup_kernel,
        out_shape=jax.ShapeDtypeStruct((PICKS, WIDTH), table.dtype),
    )(ids, table)


if __name__ == "__main__":
    table = jnp.arange(ROWS * WIDTH, dtype=jnp.float32).reshape(ROWS, WIDTH)
    ids = jnp.array([3, 17, 0, 63, 5, 5, 42, 8], jnp.int32)
    out = jax.jit(lookup)(ids, table)
    print("vmem_gather_bug: first column", np.asarray(out)[:, 0])
