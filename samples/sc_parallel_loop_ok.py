"""A running sum over chunks in a `plsc.parallel_loop` (a SparseCore kernel).

Each of 16 vector subcores copies its CHUNKS vectors of L lanes into VMEM and replaces
chunk c by the sum of chunks 0..c. The running sum is the loop's carry, the one thing parallel_loop
iterations may depend on one another through; each iteration touches only its own chunk.

Run: pallas-check run samples/sc_parallel_loop_ok.py --tpu v6e
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

        @plsc.parallel_loop(0, n, L, carry=jnp.zeros((L,), jnp.float32))
        def _(i, running):
            running = running + x_v[pl.ds(i, L)]
            x_v[pl.ds(i, L)] = running
            return running

        pltpu.sync_copy(x_v, o_hbm.at[pl.ds(s * n, n)])

    return kernel(x)


def reference(x, lanes):
    return x.reshape(NSUB, CHUNKS, lanes).cumsum(1).reshape(-1)


if __name__ == "__main__":
    L = pltpu.get_tpu_info().sparse_core.num_lanes
    x = jnp.arange(NSUB * CHUNKS * L, dtype=jnp.float32) % 7
    out = jax.jit(running_sums)(x)
    np.testing.assert_allclose(out, reference(np.asarray(x), L))
    print("sc_parallel_loop_ok: output matches")
