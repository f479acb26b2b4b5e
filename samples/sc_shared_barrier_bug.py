"""Two phases through VMEM_SHARED between subcore barriers (a SparseCore kernel), with
the SECOND barrier missing.

Phase 1: each of the 16 vector subcores sums its CHUNK vectors into row s of the shared
table a_sh. Barrier. Phase 2: subcore s reads its neighbour's row a_sh[(s+1) % 16], scales
it by s+1 and copies it into row s of b_sh. BUG: no second barrier, so subcore 0 reads
b_sh while the other subcores may still be copying their rows into it: a race on the shared
rows (and rows not yet written reach the output).

Run: pallas-check run samples/sc_shared_barrier_bug.py --tpu v6e --races
Expected finding: kind=race buffer=b_sh range=[14, 0:8] line=52 args=--tpu v6e --races
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

NSUB, CHUNK = 16, 4


def rotate_sum(x):
    L = pltpu.get_tpu_info().sparse_core.num_lanes  # 8 on v6e, 16 on v7x
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=1, num_subcores=NSUB)

    @pl.kernel(out_type=jax.ShapeDtypeStruct((L,), jnp.float32), mesh=mesh,
               scratch_types=[pltpu.VMEM((CHUNK * L,), jnp.float32),
                              pltpu.VMEM((1, L), jnp.float32),
                              pltpu.VMEM((NSUB, L), jnp.float32),
                              pltpu.VMEM((L,), jnp.float32),
                              pltpu.VMEM_SHARED((NSUB, L), jnp.float32),
                              pltpu.VMEM_SHARED((NSUB, L), jnp.float32)])
    def kernel(x_hbm, o_hbm, x_v, row_v, all_v, out_v, a_sh, b_sh):
        s = jax.lax.axis_index("subcore")
        pltpu.sync_copy(x_hbm.at[pl.ds(s * CHUNK * L, CHUNK * L)], x_v)
        acc = jnp.zeros((L,), jnp.float32)
        for c in range(CHUNK):
            acc = acc + x_v[pl.ds(c * L, L)]
        row_v[0, :] = acc
        pltpu.sync_copy(row_v, a_sh.at[pl.ds(s, 1)])
        plsc.subcore_barrier()
        pltpu.sync_copy(a_sh.at[pl.ds((s + 1) % NSUB, 1)], row_v)
        row_v[0, :] = row_v[0, :] * (s + 1).astype(jnp.float32)
        pltpu.sync_copy(row_v, b_sh.at[pl.ds(s, 1)])
        # BUG: plsc.subcore_barrier() missing here.

        @pl.when(s == 0)
        def _():
            pltpu.sync_copy(b_sh, all_v)
            tot = jnp.zeros((L,), jnp.float32)
            for r in range(NSUB):
                tot = tot + all_v[r, :]
            out_v[...] = tot
            pltpu.sync_copy(out_v, o_hbm)

    return kernel(x)


def reference(x, lanes):
    parts = x.reshape(NSUB, CHUNK, lanes).sum(1)
    return sum((s + 1) * parts[(s + 1) % NSUB] for s in range(NSUB))


if __name__ == "__main__":
    L = pltpu.get_tpu_info().sparse_core.num_lanes
    x = jnp.arange(NSUB * CHUNK * L, dtype=jnp.float32) % 13
    out = jax.jit(rotate_sum)(x)
    print("sc_shared_barrier_bug: matches reference:",
          bool(np.allclose(out, reference(np.asarray(x), L))))
