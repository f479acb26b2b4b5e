"""A scatter-add from all 16 vector subcores into VMEM_SHARED between two subcore barriers
(a SparseCore kernel), with the SECOND barrier missing.

Subcore 0 zeroes the shared table; barrier; every subcore scatter-adds its L rows (all
s+1) into the shared rows idx[s*L:(s+1)*L] with one indirect DMA, add=True: atomic
read-modify-write adds, so adds of several subcores to one row do not race. BUG: no
second barrier, so subcore 0 copies the table out while other subcores' adds may still be
landing: a race on the shared rows.

Run: pallas-check run samples/sc_shared_scatter_add_bug.py --tpu v6e --races
Expected finding: kind=race buffer=table_sh range=[4, 0:8] line=52 args=--tpu v6e --races
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

TABLE, NSUB = 32, 16


def scatter_add(idx):
    L = pltpu.get_tpu_info().sparse_core.num_lanes  # 8 on v6e, 16 on v7x
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=1, num_subcores=NSUB)

    @pl.kernel(out_type=jax.ShapeDtypeStruct((TABLE, L), jnp.float32), mesh=mesh,
               scratch_types=[pltpu.VMEM((L,), jnp.int32), pltpu.VMEM((L, L), jnp.float32),
                              pltpu.VMEM((TABLE, L), jnp.float32),
                              pltpu.VMEM_SHARED((TABLE, L), jnp.float32),
                              pltpu.SemaphoreType.DMA])
    def kernel(idx_hbm, o_hbm, idx_v, rows_v, zeros_v, table_sh, sem):
        s = jax.lax.axis_index("subcore")

        @pl.when(s == 0)
        def _():
            for r in range(TABLE):
                zeros_v[r, :] = jnp.zeros((L,), jnp.float32)
            pltpu.sync_copy(zeros_v, table_sh)

        plsc.subcore_barrier()
        pltpu.sync_copy(idx_hbm.at[pl.ds(s * L, L)], idx_v)
        for r in range(L):
            rows_v[r, :] = jnp.full((L,), 1.0, jnp.float32) * (s + 1).astype(jnp.float32)
        pltpu.async_copy(rows_v, table_sh.at[idx_v], sem, add=True).wait()
        # BUG: plsc.subcore_barrier() missing here.

        @pl.when(s == 0)
        def _():
            pltpu.sync_copy(table_sh, o_hbm)

    return kernel(idx)


def reference(idx, lanes):
    table = np.zeros((TABLE, lanes), np.float32)
    vals = np.repeat(np.arange(1, NSUB + 1, dtype=np.float32), lanes)[:, None]
    np.add.at(table, idx, vals * np.ones((1, lanes), np.float32))
    return table


if __name__ == "__main__":
    L = pltpu.get_tpu_info().sparse_core.num_lanes
    idx = (jnp.arange(NSUB * L, dtype=jnp.int32) * 5) % TABLE  # rows hit by several subcores
    out = jax.jit(scatter_add)(idx)
    print("sc_shared_scatter_add_bug: matches reference:",
          bool(np.allclose(out, reference(np.asarray(idx), L))))
