"""A weighted gather-reduce on a SparseCore, as a mixture-of-experts combine does it:
out[t] = sum_k w[t*K + k] * table[idx[t*K + k]] for K = 4 rows per token.

Each of 4 vector subcores owns CHUNKS chunks of L gathered rows (L // K tokens; L = the
chip's lanes). It copies its index and weight slices into VMEM, then gathers chunk j's
rows by one indirect DMA (`table_hbm.at[idx_v.at[pl.ds(j * L, L)]]`) into slot j % 2 of a
two-slot buffer, starting chunk j + 1's gather into the other slot before it reduces
chunk j: the gather in flight never lands where the reduction reads, and a slot is
gathered into again only after the reduction that read it is over (the next gather into
it starts in the next chunk, after that reduction's `parallel_loop` ended). The reduction runs in a
`parallel_loop` over the lanes of a row, L at a time: each iteration multiplies its
(L,)-vector of each row by the row's weight (a lane of one loaded weight vector), adds a
token's K rows and writes its own lanes of the output rows, so no iteration reads what
another writes. The chunk's output rows go to HBM by a plain copy. Expected findings:
none.

Run: pallas-check run samples/sc_gather_reduce_ok.py --tpu v6e
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

VOCAB, K, NSUB, CHUNKS, D = 64, 4, 4, 2, 128  # HBM rows 128-lane aligned (Mosaic SC)


def gather_reduce(table, idx, w):
    L = pltpu.get_tpu_info().sparse_core.num_lanes  # 8 on v6e, 16 on v7x
    per_sub = CHUNKS * L  # gathered rows per subcore
    tokens = L // K  # per chunk
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=1, num_subcores=NSUB)

    @pl.kernel(out_type=jax.ShapeDtypeStruct((idx.shape[0] // K, D), jnp.float32),
               mesh=mesh,
               scratch_types=[pltpu.VMEM((per_sub,), jnp.int32),
                              pltpu.VMEM((per_sub,), jnp.float32),
                              pltpu.VMEM((2, L, D), jnp.float32),
                              pltpu.VMEM((tokens, D), jnp.float32),
                              pltpu.SemaphoreType.DMA((2,))])
    def kernel(table_hbm, idx_hbm, w_hbm, o_hbm, idx_v, w_v, rows_v, out_v, sems):
        s = jax.lax.axis_index("subcore")
        pltpu.sync_copy(idx_hbm.at[pl.ds(s * per_sub, per_sub)], idx_v)
        pltpu.sync_copy(w_hbm.at[pl.ds(s * per_sub, per_sub)], w_v)

        def gather(j, slot):
            return pltpu.make_async_copy(table_hbm.at[idx_v.at[pl.ds(j * L, L)]],
                                         rows_v.at[slot], sems.at[slot])

        gather(0, 0).start()

        @pl.loop(0, CHUNKS)
        def _(j):
            slot = j % 2
            gather(j, slot).wait()

            @pl.when(j + 1 < CHUNKS)
            def _():
                gather(j + 1, 1 - slot).start()

            @plsc.parallel_loop(0, D, L)
            def _(c):  # lanes [c, c + L) of every token of the chunk
                wv = w_v[pl.ds(j * L, L)]
                cols = pl.ds(c, L)
                for t in range(tokens):
                    acc = rows_v[slot, t * K, cols] * wv[t * K]
                    for k in range(1, K):
                        acc = acc + rows_v[slot, t * K + k, cols] * wv[t * K + k]
                    out_v[t, cols] = acc

            pltpu.sync_copy(out_v, o_hbm.at[pl.ds((s * CHUNKS + j) * tokens, tokens)])

    return kernel(table, idx, w)


if __name__ == "__main__":
    L = pltpu.get_tpu_info().sparse_core.num_lanes
    rows = NSUB * CHUNKS * L
    table = (np.arange(VOCAB * D, dtype=np.float32) % 23).reshape(VOCAB, D)
    idx = ((np.arange(rows, dtype=np.int32) * 37) % VOCAB).astype(np.int32)
    w = ((np.arange(rows) % 5) * 0.25).astype(np.float32)
    out = jax.jit(gather_reduce)(jnp.asarray(table), jnp.asarray(idx), jnp.asarray(w))
    want = (table[idx] * w[:, None]).reshape(-1, K, D).sum(axis=1)
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-6)
    print("sc_gather_reduce_ok: output matches")
