"""DMAs of ragged blocks (issue 35, item 12): `pltpu.emit_pipeline` rounds a ragged last
block's DMA up to Mosaic's tile, into the array's tile padding (engine/memory/tiling.py).
On a TPU that is part of the array's allocation: no out-of-bounds, the padding's values
undefined (never written here: they reach an output only through a kernel's own
defect, then an `uninitialized` finding), writes there lost. A block past the padding
is out of bounds as before; a SparseCore kernel's arrays get no padding."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

from pallas_check.config import Config, DmaMode
from pallas_check.findings.finding import FindingKind, format_range


def _describe_all(r):
    return [f.message for f in r.findings]


def _config(mode=DmaMode.ON_WAIT):
    return Config(dma_mode=mode, races=True, schedules=3 if mode == DmaMode.RANDOM else 1)


def _pipelined(shape, block, dtype, grid=None):
    """o = x * 2 over HBM refs, through emit_pipeline in `block`s."""
    grid = grid or tuple(pl.cdiv(s, b) for s, b in zip(shape, block))
    index = (lambda i: (i,)) if len(shape) == 1 else (lambda i, j: (i, j))

    def kernel(x_hbm, o_hbm):
        def body(x_ref, o_ref):
            o_ref[...] = x_ref[...] * 2

        pltpu.emit_pipeline(body, grid=grid, in_specs=[pl.BlockSpec(block, index)],
                            out_specs=[pl.BlockSpec(block, index)])(x_hbm, o_hbm)

    def call(x):
        return pl.pallas_call(kernel, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                              out_specs=pl.BlockSpec(memory_space=pl.ANY),
                              out_shape=jax.ShapeDtypeStruct(shape, dtype))(x)
    return jax.jit(call)


@pytest.mark.parametrize("shape, block, dtype, mode", [
    ((8, 600), (8, 256), jnp.float32, DmaMode.ON_WAIT),  # lanes 512..640 of 600
    ((8, 600), (8, 256), jnp.float32, DmaMode.RANDOM),
    ((601, 128), (256, 128), jnp.float32, DmaMode.EAGER),  # rows 512..608 of 601
    ((600,), (256,), jnp.float32, DmaMode.ON_WAIT),  # 1-D: 512..640 of 600
    ((20, 600), (16, 256), jnp.bfloat16, DmaMode.ON_WAIT),  # both ragged, packed rows
], ids=["lanes", "lanes-random", "rows-eager", "1d", "bf16"])
def test_a_ragged_last_block_stays_in_the_tile_padding(check, shape, block, dtype, mode):
    """Before: two out-of-bounds findings per ragged block (copy in and copy out)."""
    x = (jnp.arange(int(np.prod(shape))) % 97).astype(dtype).reshape(shape)
    r = check(_pipelined(shape, block, dtype), x, config=_config(mode))
    assert r.session.engine_error is None, r.session.engine_error
    assert r.findings == [], [f.message for f in r.findings]
    np.testing.assert_array_equal(np.asarray(r.value, np.float32),
                                  np.asarray(x, np.float32) * 2)


def test_a_block_past_the_padding_is_out_of_bounds(check):
    """Four blocks of 256 lanes over 600: block 3 (768..1024) is past the 640 the array
    occupies, on the copy in and the copy out; the ragged block 2 is no finding."""
    r = check(_pipelined((8, 600), (8, 256), jnp.float32, grid=(1, 4)),
              jnp.ones((8, 600), jnp.float32), config=_config())
    found = sorted((f.buffer, format_range(f.index_range)) for f in r.findings
                   if f.kind is FindingKind.OUT_OF_BOUNDS)
    assert found == [("o_hbm", "[0:8, 768:1024]"), ("x_hbm", "[0:8, 768:1024]")], \
        [f.message for f in r.findings]


def _row_sums(x_hbm, o_ref):
    """Sums each row of x over whole 256-lane blocks: the ragged block's padding lanes
    are summed too (the kernel's defect: on a TPU they hold anything)."""
    o_ref[...] = jnp.zeros_like(o_ref)

    def body(x_ref):
        o_ref[...] += jnp.sum(x_ref[...], axis=1, keepdims=True) * jnp.ones((1, 128))

    pltpu.emit_pipeline(body, grid=(pl.cdiv(x_hbm.shape[1], 256),),
                        in_specs=[pl.BlockSpec((8, 256), lambda j: (0, j))])(x_hbm)


def test_padding_that_reaches_an_output_is_uninitialized(check):
    call = jax.jit(lambda x: pl.pallas_call(
        _row_sums, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))(x))
    r = check(call, jnp.ones((8, 600), jnp.float32), config=_config())
    assert [f.kind for f in r.findings] == [FindingKind.UNINITIALIZED], _describe_all(r)
    (f,) = r.findings
    assert f.buffer.endswith("window_ref") and "[0, 0:8, 88:128]" in f.message, f.message


def _store_into_padding(x_hbm, o_hbm, buf, sem):
    """A manual DMA of 128 lanes into lanes 512..640 of a 600-lane output (the last 40
    lanes of buf never written: they land in the padding). The start is traced, as
    emit_pipeline's is (JAX refuses a static slice past the shape)."""
    buf[:, :88] = jnp.ones((8, 88), jnp.float32) * 3
    pltpu.sync_copy(x_hbm.at[:, pl.ds(0, 512)], o_hbm.at[:, pl.ds(0, 512)])
    last = pl.multiple_of(pl.program_id(0) + 512, 128)
    pltpu.async_copy(buf, o_hbm.at[:, pl.ds(last, 128)], sem).wait()


@pytest.mark.parametrize("mode", [DmaMode.ON_WAIT, DmaMode.EAGER], ids=lambda m: m.value)
def test_never_written_data_landing_in_the_padding_is_lost_not_a_finding(check, mode):
    call = jax.jit(lambda x: pl.pallas_call(
        _store_into_padding, grid=(1,), in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA],
        out_shape=jax.ShapeDtypeStruct((8, 600), jnp.float32))(x))
    x = jnp.arange(8 * 600, dtype=jnp.float32).reshape(8, 600)
    r = check(call, x, config=_config(mode))
    assert r.findings == [], _describe_all(r)
    want = np.asarray(x).copy()
    want[:, 512:] = 3
    np.testing.assert_array_equal(np.asarray(r.value), want)


def test_a_sparsecore_kernel_has_no_padding(check):
    """A SparseCore kernel's copy of 128 lanes of a 120-lane array is out of bounds."""
    def run(x):
        mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                      num_cores=1, num_subcores=1)

        @pl.kernel(out_type=jax.ShapeDtypeStruct((8, 128), jnp.float32), mesh=mesh,
                   scratch_types=[pltpu.VMEM((8, 128), jnp.float32)])
        def kernel(x_hbm, o_hbm, buf):
            pltpu.sync_copy(x_hbm.at[:, pl.ds(0, 128)], buf)
            pltpu.sync_copy(buf, o_hbm)

        return jax.jit(kernel)(x)

    r = check(run, jnp.ones((8, 120), jnp.float32), config=Config(tpu="v6e"))
    oob = [f for f in r.findings if f.kind is FindingKind.OUT_OF_BOUNDS]
    assert [(f.buffer, format_range(f.index_range)) for f in oob] == [
        ("x_hbm", "[0:8, 0:128]")], _describe_all(r)
