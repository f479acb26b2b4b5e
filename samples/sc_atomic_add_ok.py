"""Chunk sums accumulated with `plsc.addupdate` from the iterations of a
`plsc.parallel_loop` (a SparseCore kernel).

Each of 16 vector subcores copies its CHUNKS vectors of L lanes into VMEM and adds every
chunk into one L-lane accumulator. parallel_loop iterations may overlap on the chip, but
`plsc.addupdate` is an atomic add (jax/_src/pallas/mosaic/sc_primitives.py): adds of
several iterations into the same lanes never race and all land. libtpu 0.0.42 compiles
the kernel for v6e and v7x.

Run: pallas-check run samples/sc_atomic_add_ok.py --tpu v6e --races
Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

NSUB, CHUNKS = 16, 4


def chunk_sums(x):
    L = pltpu.get_tpu_info().sparse_core.num_lanes  # 8 on v6e, 16 on v7x
    n = CHUNKS * L
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=1, num_subcores=NSUB)

    @pl.kernel(out_type=jax.ShapeDtypeStruct((NSUB * L,), jnp.float32), mesh=mesh,
               scratch_types=[pltpu.VMEM((n,), jnp.float32), pltpu.VMEM((L,), jnp.float32)])
    def kernel(x_hbm, o_hbm, x_v, acc_v):
        s = jax.lax.axis_index("subcore")
        pltpu.sync_copy(x_hbm.at[pl.ds(s * n, n)], x_v)
        acc_v[...] = jnp.zeros((L,), jnp.float32)

        @plsc.parallel_loop(0, n, L)
        def _(i):
            plsc.addupdate(acc_v.at[pl.ds(0, L)], x_v[pl.ds(i, L)])

        pltpu.sync_copy(acc_v, o_hbm.at[pl.ds(s * L, L)])

    return kernel(x)


def reference(x, lanes):
    return x.reshape(NSUB, CHUNKS, lanes).sum(1).reshape(-1)


if __name__ == "__main__":
    L = pltpu.get_tpu_info().sparse_core.num_lanes
    x = jnp.arange(NSUB * CHUNKS * L, dtype=jnp.float32) % 7
    out = jax.jit(chunk_sums)(x)
    np.testing.assert_allclose(out, reference(np.asarray(x), L))
    print("sc_atomic_add_ok: output matches")
