"""pallas_call features of the grid and its BlockSpecs, each checked three ways (see
tests/_three_ways.py): grids of rank 0-3, BlockSpec dims, edge blocks, dtypes, reductions
over an arbitrary axis, scalar prefetch, input_output_aliases."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from _three_ways import F32, BF16, I32, run_checked, arange, pids_offset


# ---------------------------------------------------------------------------------------
# Grids of rank 0-3, BlockSpec dims (ints, pl.Blocked, None, pl.Squeezed), edge blocks.

GRID_CASES = {
    # name: (array shape, block shape, grid)
    "rank0-whole": ((16, 128), None, ()),
    "rank0-spec": ((16, 128), (16, 128), ()),
    "rank1": ((32, 256), (8, 256), (4,)),
    "rank1-blocked": ((32, 256), (pl.Blocked(8), pl.Blocked(256)), (4,)),
    "rank2": ((16, 256), (8, 128), (2, 2)),
    "rank2-edge": ((20, 200), (8, 128), (3, 2)),
    "rank2-edge-blocked": ((20, 200), (pl.Blocked(8), 128), (3, 2)),
    "rank3-none": ((2, 16, 256), (None, 8, 128), (2, 2, 2)),
    "rank3-squeezed": ((3, 16, 200), (pl.Squeezed(), 8, 128), (3, 2, 2)),
    "rank3-edge": ((3, 20, 130), (2, 8, 128), (2, 3, 2)),
}


def _grid_call(x, block, grid, interpret=False):
    rank = len(grid)

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2 + pids_offset(rank).astype(x_ref.dtype)

    kwargs = {}
    if block is not None:
        imap = lambda *g: tuple(g) + (0,) * (x.ndim - len(g))  # noqa: E731
        kwargs = dict(in_specs=[pl.BlockSpec(block, imap)], out_specs=pl.BlockSpec(block, imap))
    return pl.pallas_call(kernel, grid=grid, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          interpret=interpret, **kwargs)(x)


def _grid_reference(x, block, grid):
    x = np.asarray(x)
    rank = len(grid)
    sizes = []
    for d in range(x.ndim):
        b = x.shape[d] if block is None else block[d]
        b = 1 if b is None or isinstance(b, pl.Squeezed) else getattr(b, "block_size", b)
        sizes.append(b)
    idx = np.indices(x.shape)
    off = sum((idx[a] // sizes[a]) * 10 ** (rank - 1 - a) for a in range(rank))
    return x * 2 + off + 1000 * int(np.prod(grid))


@pytest.mark.parametrize("case,dtype", [(c, F32) for c in GRID_CASES]
                         + [(c, I32) for c in ("rank0-whole", "rank2-edge", "rank3-squeezed")])
def test_grid_and_block_specs(check, case, dtype):
    shape, block, grid = GRID_CASES[case]
    x = arange(shape, dtype, mod=97)
    fn = lambda x, interpret=False: _grid_call(x, block, grid, interpret)  # noqa: E731
    run_checked(check, fn, x, reference=_grid_reference(x, block, grid).astype(dtype))


@pytest.mark.parametrize("dtype", [F32, BF16, I32])
def test_elementwise_dtypes(check, dtype):
    x = arange((16, 256), dtype, mod=31)
    y = arange((16, 256), dtype, mod=7)

    def fn(x, y, interpret=False):
        def kernel(x_ref, y_ref, o_ref, m_ref):
            o_ref[...] = x_ref[...] * 2 + y_ref[...]
            m_ref[...] = jnp.maximum(x_ref[...], y_ref[...])

        spec = pl.BlockSpec((8, 128), lambda i, j: (i, j))
        sds = jax.ShapeDtypeStruct(x.shape, x.dtype)
        return pl.pallas_call(kernel, grid=(2, 2), in_specs=[spec, spec],
                              out_specs=[spec, spec], out_shape=[sds, sds],
                              interpret=interpret)(x, y)

    run_checked(check, fn, x, y, reference=[x * 2 + y, jnp.maximum(x, y)])


# ---------------------------------------------------------------------------------------
# Reductions over an 'arbitrary' axis: matmul with the accumulator in the output block
# (revisited on consecutive steps) or in a VMEM scratch; dot products in several dtypes.

@pytest.mark.parametrize("variant", ["f32-out-acc", "bf16-scratch-acc", "i32-out-acc",
                                     "f32-dot-general-nt"])
def test_matmul_reduction(check, variant):
    m, k, n, bm, bk, bn = 32, 256, 256, 16, 128, 128
    in_dtype = {"f32-out-acc": F32, "bf16-scratch-acc": BF16, "i32-out-acc": I32,
                "f32-dot-general-nt": F32}[variant]
    out_dtype = in_dtype
    acc_dtype = I32 if in_dtype == I32 else F32
    x = arange((m, k), in_dtype, mod=13) - 6
    y = arange((k, n), in_dtype, mod=11) - 5
    nt = variant == "f32-dot-general-nt"
    scratch = variant == "bf16-scratch-acc"
    if nt:
        y = y.T  # (n, k); contract the last dims of both

    def fn(x, y, interpret=False):
        def kernel(x_ref, y_ref, o_ref, *scratch_refs):
            acc_ref = scratch_refs[0] if scratch else o_ref
            kk = pl.program_id(2)

            @pl.when(kk == 0)
            def _():
                acc_ref[...] = jnp.zeros(acc_ref.shape, acc_ref.dtype)

            if nt:
                prod = lax.dot_general(x_ref[...], y_ref[...], (((1,), (1,)), ((), ())),
                                       preferred_element_type=acc_dtype)
            else:
                prod = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=acc_dtype)
            acc_ref[...] += prod.astype(acc_ref.dtype)

            if scratch:
                @pl.when(kk == pl.num_programs(2) - 1)
                def _():
                    o_ref[...] = acc_ref[...].astype(o_ref.dtype)

        y_spec = (pl.BlockSpec((bn, bk), lambda i, j, kk: (j, kk)) if nt
                  else pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)))
        return pl.pallas_call(
            kernel, grid=(m // bm, n // bn, k // bk),
            in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)), y_spec],
            out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
            out_shape=jax.ShapeDtypeStruct((m, n), out_dtype),
            scratch_shapes=[pltpu.VMEM((bm, bn), acc_dtype)] if scratch else [],
            compiler_params=pltpu.CompilerParams(
                dimension_semantics=("parallel", "parallel", "arbitrary")),
            interpret=interpret)(x, y)

    yy = y.T if nt else y
    want = jnp.dot(x, yy, preferred_element_type=acc_dtype).astype(out_dtype)
    run_checked(check, fn, x, y, reference=want, rtol=1e-5)


# ---------------------------------------------------------------------------------------
# Scalar prefetch driving index maps and read from SMEM in the kernel.

@pytest.mark.parametrize("num_scalars", [1, 2])
def test_scalar_prefetch(check, num_scalars):
    x = arange((32, 128))
    idx = jnp.array([2, 0, 3, 1], jnp.int32)
    extra = [jnp.array([5, 6, 7, 8], jnp.int32)] if num_scalars == 2 else []

    def fn(idx, *rest, interpret=False):
        *extra, x = rest

        def kernel(s_ref, *refs):
            *t_ref, x_ref, o_ref, p_ref = refs
            i = pl.program_id(0)
            add = s_ref[i] + (10 * t_ref[0][i] if t_ref else 0)
            o_ref[...] = x_ref[...] + add.astype(F32)
            p_ref[...] = x_ref[...] * 0 + i.astype(F32)

        grid_spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=num_scalars, grid=(4,),
            in_specs=[pl.BlockSpec((8, 128), lambda i, s, *t: (s[i], 0))],
            out_specs=[pl.BlockSpec((8, 128), lambda i, s, *t: (i, 0)),
                       pl.BlockSpec((8, 128), lambda i, s, *t: (s[i], 0))])  # a scatter
        sds = jax.ShapeDtypeStruct(x.shape, x.dtype)
        return pl.pallas_call(kernel, grid_spec=grid_spec, out_shape=[sds, sds],
                              interpret=interpret)(idx, *extra, x)

    blocks = np.asarray(x).reshape(4, 8, 128)
    add = np.asarray(idx) + (10 * np.asarray(extra[0]) if extra else 0)
    gather = (blocks[np.asarray(idx)] + add[:, None, None]).reshape(32, 128)
    scatter = np.zeros((4, 8, 128), np.float32)
    scatter[np.asarray(idx)] = np.arange(4)[:, None, None]
    run_checked(check, fn, idx, *extra, x, reference=[gather, scatter.reshape(32, 128)])


def test_scalar_prefetch_index_maps_compile_nothing(check, monkeypatch):
    """Index maps that read the prefetched scalars run by numpy (engine/jaxpr/points.py):
    with the compiled path made to fail, the gather and the scatter still come out right."""
    from pallas_check.engine.call import describe

    def compiled(*args: object) -> None:
        raise AssertionError("an index map was compiled")

    monkeypatch.setattr(describe, "_index_map_fn", compiled)
    test_scalar_prefetch(check, 2)


# ---------------------------------------------------------------------------------------
# input_output_aliases: untouched elements keep the input's values.

@pytest.mark.parametrize("how", ["blocked", "hbm-dma", "edge", "prefetch"])
def test_input_output_aliases(check, how):
    x = arange((20, 128) if how == "edge" else (16, 128))
    idx = jnp.array([1, 0], I32)

    def fn(x, interpret=False):
        if how == "edge":  # the last block, rows 16:24 of 20, written back within the array
            def kernel(x_ref, o_ref):
                o_ref[...] = jnp.full(o_ref.shape, -1.0, F32)

            spec = pl.BlockSpec((8, 128), lambda i: (2, 0))
            return pl.pallas_call(kernel, grid=(1,), in_specs=[spec], out_specs=spec,
                                  out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                                  input_output_aliases={0: 0}, interpret=interpret)(x)
        if how == "prefetch":  # alias indices count the scalar-prefetch operands
            def kernel(s_ref, x_ref, o_ref):
                o_ref[...] = x_ref[...] + 100 * (s_ref[pl.program_id(0)] + 1).astype(F32)

            spec = pl.BlockSpec((8, 128), lambda i, s: (s[i], 0))
            grid_spec = pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(1,),
                                                     in_specs=[spec], out_specs=spec)
            return pl.pallas_call(kernel, grid_spec=grid_spec,
                                  out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                                  input_output_aliases={1: 0}, interpret=interpret)(idx, x)
        if how == "blocked":
            def kernel(x_ref, o_ref):
                o_ref[...] = x_ref[...] * 2

            spec = pl.BlockSpec((8, 128), lambda i: (1, 0))
            return pl.pallas_call(kernel, grid=(1,), in_specs=[spec], out_specs=spec,
                                  out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                                  input_output_aliases={0: 0}, interpret=interpret)(x)

        def kernel(x_hbm, o_hbm, buf, sem):
            del x_hbm
            buf[...] = jnp.full(buf.shape, 7.0, F32)
            copy = pltpu.make_async_copy(buf, o_hbm.at[pl.ds(8, 4)], sem)
            copy.start()
            copy.wait()

        any_spec = pl.BlockSpec(memory_space=pl.ANY)
        return pl.pallas_call(kernel, in_specs=[any_spec], out_specs=any_spec,
                              out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              scratch_shapes=[pltpu.VMEM((4, 128), F32),
                                              pltpu.SemaphoreType.DMA],
                              input_output_aliases={0: 0}, interpret=interpret)(x)

    want = np.array(x)
    if how == "blocked":
        want[8:] *= 2
    elif how == "hbm-dma":
        want[8:12] = 7.0
    elif how == "edge":
        want[16:] = -1.0
    else:
        want[8:16] += 200
    run_checked(check, fn, x, reference=want)
    # and under jit, where the aliased input may be donated
    run_checked(check, jax.jit(fn, static_argnames="interpret"), x, reference=want,
                oracle=False)


# ---------------------------------------------------------------------------------------
# Index maps with primitives that vmap cannot batch (`pl.multiple_of`: no batching rule).

def test_index_map_with_multiple_of(check):
    """A scalar-prefetched Element offset and a grid-derived block index, both hinted with
    `pl.multiple_of`: the blocks are the ones the offsets name (no crash, no finding)."""
    x = arange((32, 256))
    starts = jnp.array([16, 0, 24, 8], I32)

    def fn(starts, x, interpret=False):
        def kernel(s_ref, x_ref, o_ref):
            o_ref[...] = x_ref[...] + 1.0

        grid_spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(4, 2),
            in_specs=[pl.BlockSpec((pl.Element(8), 128),
                                   lambda i, j, s: (pl.multiple_of(s[i], 8),
                                                    pl.multiple_of(j * 1, 1)))],
            out_specs=pl.BlockSpec((8, 128), lambda i, j, s: (i, j)))
        return pl.pallas_call(kernel, grid_spec=grid_spec, interpret=interpret,
                              out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(starts, x)

    rows = np.concatenate([np.arange(s, s + 8) for s in np.asarray(starts)])
    run_checked(check, fn, starts, x, reference=np.asarray(x)[rows] + 1.0)
