"""Kernels whose shapes follow the chip they are told they run on (tests/intercept/test_generations.py).
Arguments: which to run, in order.

  lanes   a SparseCore kernel over int32 vectors `get_sparse_core_info().num_lanes` wide
          (8 on v6e, 16 on v7x, whose SparseCore loads only 16-wide int32 vectors)
  blocks  a TensorCore copy whose blocks take 3/16 of `get_tpu_info().vmem_capacity_bytes`
          (v6e 24 MiB, v7x 12 MiB) with a VMEM limit of 80 % of it: its four buffers
          (double-buffered in and out) fit each chip, v6e's do not fit v7x
  spill   the lanes kernel writing an output sized for 8 lanes: right on v6e, out of bounds
          on v7x (a defect only v7x's run of the script meets)
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

SUBCORES = 4


def add_one(ids, out_lanes=None):
    lanes = plsc.get_sparse_core_info().num_lanes
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=1, num_subcores=SUBCORES)

    @pl.kernel(out_type=jax.ShapeDtypeStruct((SUBCORES * (out_lanes or lanes),), jnp.int32),
               mesh=mesh, scratch_types=[pltpu.VMEM((lanes,), jnp.int32)],
               compiler_params=pltpu.CompilerParams(needs_layout_passes=False))
    def kernel(ids_hbm, o_hbm, ids_v):
        chunk = pl.ds(jax.lax.axis_index("subcore") * lanes, lanes)
        pltpu.sync_copy(ids_hbm.at[chunk], ids_v)
        ids_v[...] = ids_v[...] + 1
        pltpu.sync_copy(ids_v, o_hbm.at[chunk])

    return kernel(ids)


def big_blocks(x):
    info = pltpu.get_tpu_info()
    rows = info.vmem_capacity_bytes * 3 // 16 // (x.shape[1] * x.dtype.itemsize)
    spec = pl.BlockSpec((rows, x.shape[1]), lambda i: (i, 0))

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0

    return pl.pallas_call(
        kernel, grid=(x.shape[0] // rows,), in_specs=[spec], out_specs=spec,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        compiler_params=pltpu.CompilerParams(
            vmem_limit_bytes=info.vmem_capacity_bytes * 4 // 5))(x)


def main(which):
    """Runs one and says whether its output is right (no assertion: `pallas-check
    compile` answers every call with zeros, and the script goes on to the next)."""
    lanes = plsc.get_sparse_core_info().num_lanes
    ids = np.arange(SUBCORES * lanes, dtype=np.int32)
    if which == "lanes":
        right = np.array_equal(np.asarray(jax.jit(add_one)(jnp.asarray(ids))), ids + 1)
    elif which == "spill":
        out = np.asarray(add_one(jnp.asarray(ids), out_lanes=8))
        right = np.array_equal(out, ids[:out.shape[0]] + 1)
    else:
        x = jnp.ones((12288, 1024), jnp.float32)  # two v6e blocks, four v7x blocks
        right = bool(np.all(np.asarray(big_blocks(x))[::1024, 0] == 2.0))
    print(f"{which}: output matches: {right}")


if __name__ == "__main__":
    for name in sys.argv[1:]:
        main(name)
