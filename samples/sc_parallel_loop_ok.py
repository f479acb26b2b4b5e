"""A running sum over chunks in a `plsc.parallel_loop` (a SparseCore kernel).

Each of 16 vector subcores copies its CHUNKS vectors of L lanes into VMEM and writes, as
chunk c of a second buffer, the sum of input chunks 0..c. parallel_loop iterations may overlap
or be reordered on the chip, so each iteration writes only its own chunk of y_v and only reads
x_v, which no iteration writes (sc_parallel_loop_bug.py updates x_v in place instead: a race).
No carry either: Mosaic rejects a vector carry ("Loop with vector carry not supported").

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
               scratch_types=[pltpu.VMEM((n,), jnp.float32), pltpu.VMEM((n,), jnp.float32)])
    def kernel(x_hbm, o_hbm, x_v, y_v):
        s = jax.lax.axis_index("subcore")
        pltpu.sync_copy(x_hbm.at[pl.ds(s * n, n)], x_v)

        @plsc.parallel_loop(0, n, L)
        def _(i):
            total = x_v[pl.ds(0, L)]
            for c in range(1, CHUNKS):  # chunks 1..CHUNKS-1 count only up to chunk i // L
                total = total + jnp.where(c * L <= i, x_v[pl.ds(c * L, L)], 0.0)
            y_v[pl.ds(i, L)] = total

        pltpu.sync_copy(y_v, o_hbm.at[pl.ds(s * n, n)])

    return kernel(x)


def reference(x, lanes):
    return x.reshape(NSUB, CHUNKS, lanes).cumsum(1).reshape(-1)


if __name__ == "__main__":
    L = pltpu.get_tpu_info().sparse_core.num_lanes
    x = jnp.arange(NSUB * CHUNKS * L, dtype=jnp.float32) % 7
    out = jax.jit(running_sums)(x)
    np.testing.assert_allclose(out, reference(np.asarray(x), L))
    print("sc_parallel_loop_ok: output matches")
