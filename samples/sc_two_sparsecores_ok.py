"""A kernel over two SparseCores: expected findings: none.

Run: pallas-check run samples/sc_two_sparsecores_ok.py --tpu v6e

`pl.kernel` over a `plsc.VectorSubcoreMesh` of 2 SparseCores x 4 vector subcores: 8 actors
(`sparsecore 0 subcore 0` ... `sparsecore 1 subcore 3`) running at once, each with private
VMEM. Worker w = core * 4 + subcore doubles rows [w*L, (w+1)*L) of x (L = the chip's lanes,
read at trace time) and sums them; it stages its partial sum in row `subcore` of its
SparseCore's VMEM_SHARED and reads it back into row w of `sums`. Each SparseCore has its
own VMEM_SHARED, so the two subcores with the same subcore index (one per SparseCore) use
different rows of memory: no race (if the two SparseCores shared one buffer, they would
race on every row).
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

NUM_CORES, NUM_SUBCORES = 2, 4


def two_sparsecores(x):
    lanes = x.shape[1]
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=NUM_CORES, num_subcores=NUM_SUBCORES)

    @pl.kernel(out_type=(jax.ShapeDtypeStruct(x.shape, x.dtype),
                         jax.ShapeDtypeStruct((NUM_CORES * NUM_SUBCORES, lanes), x.dtype)),
               mesh=mesh,
               scratch_types=[pltpu.VMEM((lanes, lanes), jnp.float32),
                              pltpu.VMEM((1, lanes), jnp.float32),
                              pltpu.VMEM_SHARED((NUM_SUBCORES, lanes), jnp.float32)])
    def kernel(x_hbm, o_hbm, sums_hbm, rows_v, part_v, shared):
        core = jax.lax.axis_index("core")
        subcore = jax.lax.axis_index("subcore")
        worker = core * NUM_SUBCORES + subcore
        pltpu.sync_copy(x_hbm.at[pl.ds(worker * lanes, lanes)], rows_v)
        acc = jnp.zeros((lanes,), jnp.float32)
        for r in range(lanes):
            acc = acc + rows_v[r, :]
            rows_v[r, :] = rows_v[r, :] * 2.0
        pltpu.sync_copy(rows_v, o_hbm.at[pl.ds(worker * lanes, lanes)])
        part_v[0, :] = acc
        pltpu.sync_copy(part_v, shared.at[pl.ds(subcore, 1)])
        pltpu.sync_copy(shared.at[pl.ds(subcore, 1)], sums_hbm.at[pl.ds(worker, 1)])

    return kernel(x)


def reference(x):
    lanes = x.shape[1]
    return 2 * x, x.reshape(-1, lanes, lanes).sum(axis=1)


if __name__ == "__main__":
    lanes = plsc.get_sparse_core_info().num_lanes  # 8 on v5p and v6e, 16 on v7x
    rows = NUM_CORES * NUM_SUBCORES * lanes
    x = (jnp.arange(rows * lanes, dtype=jnp.float32) % 7).reshape(rows, lanes)
    out, sums = jax.jit(two_sparsecores)(x)
    want_out, want_sums = reference(np.asarray(x))
    np.testing.assert_allclose(np.asarray(out), want_out)
    np.testing.assert_allclose(np.asarray(sums), want_sums)
    print("sc_two_sparsecores_ok: output matches")
