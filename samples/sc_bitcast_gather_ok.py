"""A SparseCore gather through a bitcast view: bf16 embedding rows fetched two at a time.

The table is (32, 128) bf16. Seen as uint32 (`table_hbm.bitcast(jnp.uint32)`), it is
(16, 128): row p packs bf16 rows 2p and 2p + 1 (the TPU packs along the second-minor
dimension). Each of 4 vector subcores turns its lane-wide chunk of bf16 row ids into pair
ids (`>> 1`) and gathers those uint32 rows with one indirect DMA; the host unpacks them.
What the gather moves is bits: every bf16 value comes back exactly.

Run: pallas-check run samples/sc_bitcast_gather_ok.py --tpu v6e
Expected findings: none.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

ROWS, D, NSUB = 32, 128, 4


def gather_pairs(table, ids):
    lanes = pltpu.get_tpu_info().sparse_core.num_lanes
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=1, num_subcores=NSUB)

    @pl.kernel(out_type=jax.ShapeDtypeStruct((NSUB * lanes, D), jnp.uint32), mesh=mesh,
               scratch_types=[pltpu.VMEM((lanes,), jnp.int32),
                              pltpu.VMEM((lanes, D), jnp.uint32), pltpu.SemaphoreType.DMA])
    def kernel(table_hbm, ids_hbm, o_hbm, pair_v, rows_v, sem):
        chunk = pl.ds(jax.lax.axis_index("subcore") * lanes, lanes)
        pltpu.sync_copy(ids_hbm.at[chunk], pair_v)
        pair_v[...] = pair_v[...] >> 1  # a bf16 row id -> the uint32 row holding it
        pairs = table_hbm.bitcast(jnp.uint32)  # (16, 128)
        pltpu.async_copy(pairs.at[pair_v], rows_v, sem).wait()
        pltpu.sync_copy(rows_v, o_hbm.at[chunk])

    return kernel(table, ids)


def unpack(pairs):
    """uint32 rows -> their two bf16 rows (low half first), as the TPU packs them."""
    halves = pairs.view(np.uint16).reshape(pairs.shape[0], D, 2).transpose(0, 2, 1)
    return halves.reshape(-1, D).view(jnp.bfloat16)


def table_and_ids(n):
    bits = np.random.default_rng(3).integers(0, 2**16, (ROWS, D), dtype=np.uint64)
    bits[0, :4] = [0x7FC1, 0x0001, 0xFF81, 0x3F50]  # a NaN payload, a denormal, ...
    table = bits.astype(np.uint16).view(jnp.bfloat16)
    ids = ((np.arange(n) * 5) % ROWS).astype(np.int32)
    return table, ids


if __name__ == "__main__":
    n = NSUB * pltpu.get_tpu_info().sparse_core.num_lanes
    table, ids = table_and_ids(n)
    got = np.asarray(jax.jit(gather_pairs)(jnp.asarray(table), jnp.asarray(ids)))
    rows = unpack(got).reshape(n, 2, D)[np.arange(n), ids % 2]
    assert rows.view(np.uint16).tobytes() == table[ids].view(np.uint16).tobytes()
    print("sc_bitcast_gather_ok: output matches")
