"""A running sum over chunks in a `plsc.parallel_loop` (a SparseCore kernel), computed
in place: each chunk reads the chunk before it, which another iteration writes.

Each of 16 vector subcores copies its CHUNKS vectors of L lanes into VMEM and replaces
chunk c by the sum of chunks 0..c. BUG: iteration i adds the chunk iteration i - L wrote:
parallel_loop iterations may overlap or be reordered on the chip (they may depend on one
another only through the carry), so that read races with the other iteration's write.

Run: pallas-check run samples/sc_parallel_loop_bug.py --tpu v6e --races
Expected finding: kind=race buffer=x_v range=[8:16] line=37 args=--tpu v6e --races
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

NSUB, CHUNKS = 16, 4


def running_sums(x):
    L = pltpu.get_tpu_info().sparse_core.num_lanes  # 8 on v6e, 16 on v7x
    n = CHUNKS * L
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=1, num_subcores=NSUB)

    @pl.kernel(out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), mesh=mesh,
               scratch_types=[pltpu.VMEM((n,), jnp.float32)])
    def kernel(x_hbm, o_hbm, x_v):
        s = jax.lax.axis_index("subcore")
        pltpu.sync_copy(x_hbm.at[pl.ds(s * n, n)], x_v)

        @plsc.parallel_loop(L, n, L)
        def _(i):
            x_v[pl.ds(i, L)] = x_v[pl.ds(i, L)] + x_v[pl.ds(i - L, L)]  # BUG: i - L

        pltpu.sync_copy(x_v, o_hbm.at[pl.ds(s * n, n)])

    return kernel(x)


def reference(x, lanes):
    return x.reshape(NSUB, CHUNKS, lanes).cumsum(1).reshape(-1)


if __name__ == "__main__":
    L = pltpu.get_tpu_info().sparse_core.num_lanes
    x = jnp.arange(NSUB * CHUNKS * L, dtype=jnp.float32) % 7
    out = jax.jit(running_sums)(x)
    # (simulated in order, the values happen to match; on the chip they need not)
    print("sc_parallel_loop_bug: matches reference:",
          bool(np.allclose(out, reference(np.asarray(x), L))))
