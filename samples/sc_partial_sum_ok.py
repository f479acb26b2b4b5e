"""Per-subcore partial sums combined through VMEM_SHARED (a SparseCore kernel).

Each of the 16 vector subcores of one SparseCore sums its CHUNK vectors of L lanes into one
(L,) partial and copies it into row s of a (16, L) VMEM_SHARED table; a subcore barrier;
subcore 0 copies the whole table into its VMEM, adds the rows and writes the total. The
barrier orders every subcore's copy into the table before subcore 0 reads it (without it,
subcore 0 would read rows still being written: a race).

Run: pallas-check run samples/sc_partial_sum_ok.py --tpu v6e
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

NSUB, CHUNK = 16, 4


def total(x):
    L = pltpu.get_tpu_info().sparse_core.num_lanes  # 8 on v6e, 16 on v7x
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=1, num_subcores=NSUB)

    @pl.kernel(out_type=jax.ShapeDtypeStruct((L,), jnp.float32), mesh=mesh,
               scratch_types=[pltpu.VMEM((CHUNK * L,), jnp.float32),
                              pltpu.VMEM((1, L), jnp.float32),
                              pltpu.VMEM((NSUB, L), jnp.float32),
                              pltpu.VMEM((L,), jnp.float32),
                              pltpu.VMEM_SHARED((NSUB, L), jnp.float32)])
    def kernel(x_hbm, o_hbm, x_v, part_v, all_v, out_v, parts_sh):
        s = jax.lax.axis_index("subcore")
        pltpu.sync_copy(x_hbm.at[pl.ds(s * CHUNK * L, CHUNK * L)], x_v)
        acc = jnp.zeros((L,), jnp.float32)
        for c in range(CHUNK):
            acc = acc + x_v[pl.ds(c * L, L)]
        part_v[0, :] = acc
        pltpu.sync_copy(part_v, parts_sh.at[pl.ds(s, 1)])
        plsc.subcore_barrier()

        @pl.when(s == 0)
        def _():
            pltpu.sync_copy(parts_sh, all_v)
            tot = jnp.zeros((L,), jnp.float32)
            for r in range(NSUB):
                tot = tot + all_v[r, :]
            out_v[...] = tot
            pltpu.sync_copy(out_v, o_hbm)

    return kernel(x)


if __name__ == "__main__":
    L = pltpu.get_tpu_info().sparse_core.num_lanes
    x = jnp.arange(NSUB * CHUNK * L, dtype=jnp.float32) % 17
    out = jax.jit(total)(x)
    np.testing.assert_allclose(out, np.asarray(x).reshape(-1, L).sum(0))
    print("sc_partial_sum_ok: output matches")
