"""An embedding-bag sum on a SparseCore: 8 bags of L ids each; each of 4 vector subcores
owns 2 bags; per bag it gathers the L table rows by one indirect DMA
(`table_hbm.at[ids_v]`) and sums them with (L,)-vector adds, then writes its bags' rows
to HBM.

Run: pallas-check run samples/sc_embedding_bag_ok.py --tpu v6e
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

VOCAB, NSUB, BAGS_PER_SUB, D = 50, 4, 2, 128  # HBM rows 128-lane aligned (Mosaic SC)


def bag_sum(table, ids):
    lanes = pltpu.get_tpu_info().sparse_core.num_lanes
    bags, k = ids.shape
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=1, num_subcores=NSUB)

    @pl.kernel(out_type=jax.ShapeDtypeStruct((bags, D), jnp.float32), mesh=mesh,
               scratch_types=[pltpu.VMEM((k,), jnp.int32), pltpu.VMEM((k, D), jnp.float32),
                              pltpu.VMEM((BAGS_PER_SUB, D), jnp.float32),
                              pltpu.SemaphoreType.DMA])
    def kernel(table_hbm, ids_hbm, o_hbm, ids_v, rows_v, acc_v, sem):
        s = jax.lax.axis_index("subcore")
        for j in range(BAGS_PER_SUB):
            pltpu.sync_copy(ids_hbm.at[s * BAGS_PER_SUB + j], ids_v)
            pltpu.async_copy(table_hbm.at[ids_v], rows_v, sem).wait()
            for c in range(D // lanes):  # (L,)-vectors only; no vector loop carry on SC
                acc_v[j, pl.ds(c * lanes, lanes)] = jnp.zeros((lanes,), jnp.float32)

            @pl.loop(0, k)
            def _(r):
                for c in range(D // lanes):
                    cols = pl.ds(c * lanes, lanes)
                    acc_v[j, cols] = acc_v[j, cols] + rows_v[r, cols]
        pltpu.sync_copy(acc_v, o_hbm.at[pl.ds(s * BAGS_PER_SUB, BAGS_PER_SUB)])

    return kernel(table, ids)


if __name__ == "__main__":
    lanes = pltpu.get_tpu_info().sparse_core.num_lanes
    bags = NSUB * BAGS_PER_SUB
    table = (np.arange(VOCAB * D, dtype=np.float32) % 13).reshape(VOCAB, D)
    ids = ((np.arange(bags * lanes, dtype=np.int32) * 11) % VOCAB).reshape(bags, lanes)
    out = jax.jit(bag_sum)(jnp.asarray(table), jnp.asarray(ids))
    np.testing.assert_allclose(np.asarray(out), table[ids].sum(axis=1), rtol=1e-6)
    print("sc_embedding_bag_ok: output matches")
