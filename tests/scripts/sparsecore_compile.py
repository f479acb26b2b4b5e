"""SparseCore kernels for `pallas-check compile` tests (tests/engine/call/test_sparsecore_mesh.py).

  barrier       per-subcore partial sums combined through VMEM_SHARED between two
                subcore barriers: compiles (pallas_call's TensorCore lowering cannot lower
                `barrier`: only the SparseCore lowering can)
  vector_carry  a fori_loop carrying a vector: Mosaic's SparseCore compiler refuses it
"""

import sys

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

NUM_SUBCORES = 4


def barrier(x, lanes):
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=1, num_subcores=NUM_SUBCORES)

    @pl.kernel(out_type=jax.ShapeDtypeStruct((1, lanes), jnp.float32), mesh=mesh,
               scratch_types=[pltpu.VMEM((lanes, lanes), jnp.float32),
                              pltpu.VMEM((NUM_SUBCORES, lanes), jnp.float32),
                              pltpu.VMEM_SHARED((NUM_SUBCORES, lanes), jnp.float32)])
    def kernel(x_hbm, o_hbm, rows_v, all_v, shared_v):
        subcore = jax.lax.axis_index("subcore")
        pltpu.sync_copy(x_hbm.at[pl.ds(subcore * lanes, lanes)], rows_v)
        acc = rows_v[0, :]
        for r in range(1, lanes):
            acc = acc + rows_v[r, :]
        rows_v[0, :] = acc
        pltpu.sync_copy(rows_v.at[pl.ds(0, 1)], shared_v.at[pl.ds(subcore, 1)])
        plsc.subcore_barrier()

        @pl.when(subcore == 0)
        def _():
            pltpu.sync_copy(shared_v, all_v)
            total = all_v[0, :]
            for r in range(1, NUM_SUBCORES):
                total = total + all_v[r, :]
            rows_v[0, :] = total
            pltpu.sync_copy(rows_v.at[pl.ds(0, 1)], o_hbm)

    return kernel(x)


def vector_carry(x, lanes):
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=1, num_subcores=NUM_SUBCORES)

    @pl.kernel(out_type=jax.ShapeDtypeStruct((NUM_SUBCORES, lanes), jnp.float32), mesh=mesh,
               scratch_types=[pltpu.VMEM((lanes, lanes), jnp.float32)])
    def kernel(x_hbm, o_hbm, rows_v):
        subcore = jax.lax.axis_index("subcore")
        pltpu.sync_copy(x_hbm.at[pl.ds(subcore * lanes, lanes)], rows_v)
        acc = jax.lax.fori_loop(0, lanes, lambda r, acc: acc + rows_v[r, :],
                                jnp.zeros((lanes,), jnp.float32))
        rows_v[0, :] = acc
        pltpu.sync_copy(rows_v.at[pl.ds(0, 1)], o_hbm.at[pl.ds(subcore, 1)])

    return kernel(x)


if __name__ == "__main__":
    lanes = plsc.get_sparse_core_info().num_lanes
    x = jnp.ones((NUM_SUBCORES * lanes, lanes), jnp.float32)
    fn = {"barrier": barrier, "vector_carry": vector_carry}[sys.argv[1]]
    jax.block_until_ready(jax.jit(fn, static_argnums=1)(x, lanes))
    print(f"{sys.argv[1]}: ran")
