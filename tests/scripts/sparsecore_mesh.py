"""SparseCore mesh kernels for tests/engine/call/test_sparsecore_mesh.py (not samples).

`python -m pallas_check run sparsecore_mesh.py VARIANT --tpu v6e`; each variant checks its
outputs against numpy and prints "VARIANT: output matches".
  coords       every subcore writes core * 100 + subcore into its own row (axis_index)
  chip_coords  the same over the chip's whole mesh (no num_cores / num_subcores given)
  row_race     subcore s of each SparseCore writes HBM row s: the two SparseCores race
  shared       each SparseCore fills ITS VMEM_SHARED with core + 1 and reads it back
  partial_sum  16 subcores of one SparseCore: each sums its rows into its own HBM row
  with_tc      a TensorCore pallas_call, then a SparseCore kernel, in one jit
  vmem ROWS    a (ROWS, 128) f32 VMEM scratch per subcore (vmem-exceeded tests)
  shard_map    the coords kernel under shard_map over every device (--devices N)
  mpmd         one pl.kernel over a vector and a scalar subcore mesh (not simulated yet)
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

VARIANT = sys.argv[1]


def mesh(num_cores=2, num_subcores=4):
    if num_cores is None:  # the chip's SparseCores and subcores (get_sparse_core_info)
        return plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore")
    return plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=num_cores, num_subcores=num_subcores)


def coords(lanes=8, num_cores=2, num_subcores=4, chip=False):
    @pl.kernel(out_type=jax.ShapeDtypeStruct((num_cores * num_subcores, lanes), jnp.int32),
               mesh=mesh(num_cores, num_subcores) if not chip else mesh(None),
               scratch_types=[pltpu.VMEM((1, lanes), jnp.int32)])
    def kernel(o_hbm, row_v):
        core = jax.lax.axis_index("core")
        subcore = jax.lax.axis_index("subcore")
        row_v[0, :] = jnp.full((lanes,), core * 100 + subcore, jnp.int32)
        pltpu.sync_copy(row_v, o_hbm.at[pl.ds(core * num_subcores + subcore, 1)])

    return kernel()


def coords_reference(lanes=8, num_cores=2, num_subcores=4):
    ids = [c * 100 + s for c in range(num_cores) for s in range(num_subcores)]
    return np.repeat(np.array(ids, np.int32)[:, None], lanes, axis=1)


def row_race(x):
    @pl.kernel(out_type=jax.ShapeDtypeStruct((4, 8), jnp.float32), mesh=mesh(),
               scratch_types=[pltpu.VMEM((1, 8), jnp.float32)])
    def kernel(x_hbm, o_hbm, row_v):
        subcore = jax.lax.axis_index("subcore")
        pltpu.sync_copy(x_hbm.at[pl.ds(subcore, 1)], row_v)
        pltpu.sync_copy(row_v, o_hbm.at[pl.ds(subcore, 1)])  # both SparseCores: row s

    return kernel(x)


def shared():
    @pl.kernel(out_type=jax.ShapeDtypeStruct((2, 8), jnp.float32), mesh=mesh(),
               scratch_types=[pltpu.VMEM((4, 8), jnp.float32),
                              pltpu.VMEM_SHARED((4, 8), jnp.float32)])
    def kernel(o_hbm, rows_v, shared_v):
        core = jax.lax.axis_index("core")
        subcore = jax.lax.axis_index("subcore")

        @pl.when(subcore == 0)
        def _():
            for r in range(4):
                rows_v[r, :] = jnp.full((8,), core + 1, jnp.float32)
            pltpu.sync_copy(rows_v, shared_v)
            pltpu.sync_copy(shared_v.at[pl.ds(3, 1)], o_hbm.at[pl.ds(core, 1)])

    return kernel()


def partial_sum(x):
    @pl.kernel(out_type=jax.ShapeDtypeStruct((16, 8), jnp.float32), mesh=mesh(1, 16),
               scratch_types=[pltpu.VMEM((4, 8), jnp.float32),
                              pltpu.VMEM((1, 8), jnp.float32)])
    def kernel(x_hbm, o_hbm, rows_v, sum_v):
        subcore = jax.lax.axis_index("subcore")
        pltpu.sync_copy(x_hbm.at[pl.ds(subcore * 4, 4)], rows_v)
        acc = rows_v[0, :]
        for r in range(1, 4):
            acc = acc + rows_v[r, :]
        sum_v[0, :] = acc
        pltpu.sync_copy(sum_v, o_hbm.at[pl.ds(subcore, 1)])

    return kernel(x)


def tensorcore_double(x):
    def body(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def vmem(rows):
    @pl.kernel(out_type=jax.ShapeDtypeStruct((2, 128), jnp.float32), mesh=mesh(1, 2),
               scratch_types=[pltpu.VMEM((rows, 128), jnp.float32)])
    def kernel(x_hbm, o_hbm, big_v):
        subcore = jax.lax.axis_index("subcore")
        pltpu.sync_copy(x_hbm.at[pl.ds(subcore, 1)], big_v.at[pl.ds(0, 1)])
        pltpu.sync_copy(big_v.at[pl.ds(0, 1)], o_hbm.at[pl.ds(subcore, 1)])

    return kernel


def mpmd(x):
    scalar_mesh = plsc.ScalarSubcoreMesh(axis_name="core", num_cores=2)

    def vector_body(x_hbm, o_hbm):
        del x_hbm, o_hbm

    def scalar_body(x_hbm, o_hbm):
        core = jax.lax.axis_index("core")
        pltpu.sync_copy(x_hbm.at[pl.ds(core * 8, 8)], o_hbm.at[pl.ds(core * 8, 8)])

    return pl.kernel([vector_body, scalar_body], out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
                     mesh=[mesh(), scalar_mesh])(x)


def main():
    lanes = plsc.get_sparse_core_info().num_lanes
    if VARIANT == "coords":
        got, want = jax.jit(lambda: coords(lanes))(), coords_reference(lanes)
    elif VARIANT == "chip_coords":
        info = plsc.get_sparse_core_info()
        got = jax.jit(lambda: coords(lanes, info.num_cores, info.num_subcores, chip=True))()
        want = coords_reference(lanes, info.num_cores, info.num_subcores)
        print(f"chip mesh: {info.num_cores} x {info.num_subcores}")
    elif VARIANT == "row_race":
        x = jnp.arange(32, dtype=jnp.float32).reshape(4, 8)
        got, want = jax.jit(row_race)(x), np.asarray(x)
    elif VARIANT == "shared":
        got, want = jax.jit(shared)(), np.array([[1.0] * 8, [2.0] * 8], np.float32)
    elif VARIANT == "partial_sum":
        x = (jnp.arange(64 * 8, dtype=jnp.float32) % 11).reshape(64, 8)
        got, want = jax.jit(partial_sum)(x), np.asarray(x).reshape(16, 4, 8).sum(axis=1)
    elif VARIANT == "with_tc":
        x = (jnp.arange(64 * 8, dtype=jnp.float32) % 11).reshape(64, 8)
        got = jax.jit(lambda x: partial_sum(tensorcore_double(x)))(x)
        want = 2 * np.asarray(x).reshape(16, 4, 8).sum(axis=1)
    elif VARIANT == "vmem":
        x = jnp.ones((2, 128), jnp.float32)
        got, want = jax.jit(vmem(int(sys.argv[2])))(x), np.ones((2, 128), np.float32)
    elif VARIANT == "shard_map":
        devices = jax.devices()
        device_mesh = jax.sharding.Mesh(np.array(devices), ("x",))
        spec = jax.sharding.PartitionSpec("x")
        fn = jax.shard_map(lambda: coords(lanes), mesh=device_mesh, in_specs=(),
                           out_specs=spec, check_vma=False)
        got = jax.jit(fn)()
        want = np.concatenate([coords_reference(lanes)] * len(devices))
    elif VARIANT == "mpmd":
        x = jnp.ones((16, 128), jnp.float32)
        got, want = jax.jit(mpmd)(x), np.asarray(x)
    else:
        raise SystemExit(f"unknown variant {VARIANT}")
    np.testing.assert_array_equal(np.asarray(got), want)
    print(f"{VARIANT}: output matches")


if __name__ == "__main__":
    main()
