"""Engine features, each checked three ways: against a jax.numpy reference, against JAX's
own HLO interpreter (the same pallas_call with interpret=True, run without our
interception), and for zero findings (the kernels here are all correct)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_check.config import Config, DmaMode

F32, BF16, I32 = jnp.float32, jnp.bfloat16, jnp.int32
# pltpu.semaphore_* are deprecated aliases of these in this JAX.
signal, wait, read = pl.semaphore_signal, pl.semaphore_wait, pl.semaphore_read


def _assert_close(got, want, dtype=None, rtol=1e-6):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    if got.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want)
    else:
        if got.dtype == jnp.bfloat16 or dtype == BF16:
            rtol = max(rtol, 1e-2)
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32),
                                   rtol=rtol, atol=rtol)


def _compare(got, want, rtol):
    got, want = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        _assert_close(g, w, rtol=rtol)


def run_checked(check, fn, *args, config=None, reference=None, oracle=True, rtol=1e-6,
                calls=None):
    """Run fn(*args) under pallas-check; assert no findings, the reference, the oracle."""
    r = check(fn, *args, config=config)
    assert r.session.engine_error is None, r.session.engine_error
    assert r.findings == [], [f.message for f in r.findings]
    assert r.session.calls, "the pallas_call was not intercepted"
    if calls is not None:
        assert len(r.session.calls) == calls
    if reference is not None:
        _compare(r.value, reference, rtol)
    if oracle:
        want = jax.block_until_ready(fn(*args, interpret=True))
        _compare(r.value, want, rtol)
    return r.value


def arange(shape, dtype=F32, mod=None):
    x = np.arange(int(np.prod(shape))).reshape(shape)
    if mod:
        x = x % mod
    return jnp.asarray(x, dtype=dtype)


def pids_offset(rank):
    """sum_a program_id(a) * 10**(rank-1-a) + 1000 * prod(num_programs)."""
    off = jnp.int32(0)
    n = jnp.int32(1)
    for a in range(rank):
        off = off + pl.program_id(a) * 10 ** (rank - 1 - a)
        n = n * pl.num_programs(a)
    return off + 1000 * n


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


# ---------------------------------------------------------------------------------------
# scratch_shapes (VMEM, SMEM, DMA and REGULAR semaphores) with an HBM operand.

@pytest.mark.parametrize("mode", [DmaMode.EAGER, DmaMode.ON_WAIT])
def test_scratch_shapes_and_semaphores(check, mode):
    x = arange((32, 128))

    def fn(x, interpret=False):
        def kernel(x_hbm, o_ref, cnt_ref, buf, counter, dsem, rsem):
            i = pl.program_id(0)

            @pl.when(i == 0)
            def _():
                counter[0] = 0
                o_ref[...] = jnp.zeros_like(o_ref)

            copy = pltpu.make_async_copy(x_hbm.at[pl.ds(i * 8, 8)], buf, dsem)
            copy.start()
            copy.wait()
            o_ref[...] += buf[...]
            counter[0] += 1
            signal(rsem, 2)
            v = read(rsem)
            wait(rsem, 2)
            cnt_ref[0] = counter[0] * 10 + v + read(rsem)

        return pl.pallas_call(
            kernel, grid=(4,),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=[pl.BlockSpec((8, 128), lambda i: (0, 0)),
                       pl.BlockSpec(memory_space=pltpu.SMEM)],
            out_shape=[jax.ShapeDtypeStruct((8, 128), F32), jax.ShapeDtypeStruct((1,), I32)],
            scratch_shapes=[pltpu.VMEM((8, 128), F32), pltpu.SMEM((1,), I32),
                            pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.REGULAR],
            compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
            interpret=interpret)(x)

    run_checked(check, fn, x, config=Config(dma_mode=mode),
                reference=[x.reshape(4, 8, 128).sum(0), jnp.array([42], I32)])


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
# Manual DMAs from HBM with double buffering, three copy APIs, both DMA modes.

@pytest.mark.parametrize("mode", [DmaMode.EAGER, DmaMode.ON_WAIT])
@pytest.mark.parametrize("api", ["make_async_copy", "async_copy", "sync_copy"])
def test_manual_dma_pipeline(check, api, mode):
    if api == "sync_copy" and not hasattr(pltpu, "sync_copy"):
        pytest.skip("pltpu.sync_copy is not in this JAX")
    chunks = 8
    x = arange((chunks * 8, 128))

    def fn(x, interpret=False):
        def kernel(x_hbm, o_hbm, buf, obuf, sems, osem):
            def start(c, slot):
                src, dst = x_hbm.at[pl.ds(c * 8, 8)], buf.at[slot]
                if api == "make_async_copy":
                    pltpu.make_async_copy(src, dst, sems.at[slot]).start()
                elif api == "async_copy":
                    pltpu.async_copy(src, dst, sems.at[slot])
                else:
                    pltpu.sync_copy(src, dst)

            def finish(slot):
                if api != "sync_copy":
                    pltpu.make_async_copy(x_hbm.at[pl.ds(0, 8)], buf.at[slot],
                                          sems.at[slot]).wait()

            start(0, 0)

            def body(c, carry):
                slot = c % 2

                @pl.when(c + 1 < chunks)
                def _():
                    start(c + 1, 1 - slot)

                finish(slot)
                obuf[pl.ds(pl.multiple_of(c * 8, 8), 8), :] = buf[slot] * 2 + c.astype(F32)
                return carry

            lax.fori_loop(0, chunks, body, 0)
            out = pltpu.make_async_copy(obuf, o_hbm, osem)
            out.start()
            out.wait()

        any_spec = pl.BlockSpec(memory_space=pl.ANY)
        return pl.pallas_call(
            kernel, in_specs=[any_spec], out_specs=any_spec,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            scratch_shapes=[pltpu.VMEM((2, 8, 128), F32), pltpu.VMEM(x.shape, F32),
                            pltpu.SemaphoreType.DMA((2,)), pltpu.SemaphoreType.DMA],
            interpret=interpret)(x)

    want = x * 2 + jnp.repeat(jnp.arange(chunks, dtype=F32), 8)[:, None]
    run_checked(check, fn, x, config=Config(dma_mode=mode), reference=want)


@pytest.mark.parametrize("mode", [DmaMode.EAGER, DmaMode.ON_WAIT])
def test_dma_across_grid_steps(check, mode):
    """Step i starts the copy that step i+1 waits for (scratch persists across steps)."""
    x = arange((32, 128))

    def fn(x, interpret=False):
        def kernel(x_hbm, o_ref, buf, sems):
            i, n = pl.program_id(0), pl.num_programs(0)

            def copy(j, slot):
                return pltpu.make_async_copy(x_hbm.at[pl.ds(j * 8, 8)], buf.at[slot],
                                             sems.at[slot])

            @pl.when(i == 0)
            def _():
                copy(0, 0).start()

            @pl.when(i + 1 < n)
            def _():
                copy(i + 1, (i + 1) % 2).start()

            copy(i, i % 2).wait()
            o_ref[...] = buf[i % 2] + 1

        return pl.pallas_call(
            kernel, grid=(4,), in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct((32, 128), F32),
            scratch_shapes=[pltpu.VMEM((2, 8, 128), F32), pltpu.SemaphoreType.DMA((2,))],
            compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
            interpret=interpret)(x)

    run_checked(check, fn, x, config=Config(dma_mode=mode), reference=x + 1)


# ---------------------------------------------------------------------------------------
# pl.run_scoped with a VMEM buffer and a DMA semaphore, returning a value.

def test_run_scoped(check):
    x = arange((16, 128))

    def fn(x, interpret=False):
        def kernel(x_hbm, o_ref):
            def body(buf, sem):
                copy = pltpu.make_async_copy(x_hbm.at[pl.ds(8, 8)], buf, sem)
                copy.start()
                copy.wait()
                o_ref[...] = buf[...] + 1
                return jnp.sum(buf[...])

            total = pl.run_scoped(body, pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA)
            o_ref[0, :] = jnp.full((128,), total, F32)

        return pl.pallas_call(kernel, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                              out_shape=jax.ShapeDtypeStruct((8, 128), F32),
                              interpret=interpret)(x)

    want = np.array(x[8:] + 1)
    want[0, :] = np.sum(np.asarray(x[8:]))
    run_checked(check, fn, x, reference=want, rtol=1e-5)


# ---------------------------------------------------------------------------------------
# Control flow inside kernels, with refs read and written in the bodies.

def _control_kernel(kind):
    def kernel(n_ref, x_ref, o_ref, s_ref):
        n = n_ref[0]
        if kind == "cond":
            def yes():
                o_ref[...] = x_ref[...] * 2

            def no():
                o_ref[...] = x_ref[...] - 1

            lax.cond(n > 2, yes, no)
            lax.cond(pl.program_id(0) == 1, lambda: o_ref.__setitem__(
                (0, slice(None)), jnp.zeros((128,), F32)), lambda: None)
            return
        o_ref[...] = jnp.zeros_like(o_ref)
        if kind == "while":
            def cond(c):
                return c[0] < n

            def body(c):
                i, s = c
                o_ref[pl.ds(i, 1), :] = x_ref[pl.ds(i, 1), :] * i.astype(F32) + s
                return i + 1, s + 1.0

            lax.while_loop(cond, body, (jnp.int32(0), jnp.float32(0)))
        elif kind == "scan":
            def step(carry, row):
                i, acc = carry
                acc = acc + x_ref[pl.ds(i, 1), :]
                o_ref[pl.ds(i, 1), :] = acc
                return (i + 1, acc), row * 2

            (_, acc), ys = lax.scan(step, (jnp.int32(0), jnp.zeros((1, 128), F32)),
                                    jnp.arange(8, dtype=F32))
            o_ref[pl.ds(7, 1), :] = acc + jnp.sum(ys)
        elif kind in ("fori-static", "fori-dynamic"):
            upper = 8 if kind == "fori-static" else n

            def body(i, acc):
                o_ref[pl.ds(i, 1), :] = x_ref[pl.ds(i, 1), :] + acc
                return acc + o_ref[pl.ds(i, 1), :]

            lax.fori_loop(0, upper, body, jnp.zeros((1, 128), F32))
        elif kind == "fori-unrolled":
            def body(i, carry):
                o_ref[pl.ds(i, 1), :] = x_ref[pl.ds(i, 1), :] * 3
                return carry

            lax.fori_loop(0, 8, body, 0, unroll=True)
        elif kind == "jit":
            @jax.jit
            def inner(a, b):
                return jnp.sin(a) * b + 1

            o_ref[...] = inner(x_ref[...], n.astype(F32))
        elif kind == "jit-ref":
            @jax.jit
            def inner(r, rows):
                r[pl.ds(2, 4), :] = rows * 3

            inner(o_ref, x_ref[pl.ds(2, 4), :])
        elif kind == "while-ref-cond":  # the loop condition reads a ref the body writes
            s_ref[0] = 0

            def body(carry):
                i = s_ref[0]
                o_ref[pl.ds(i, 1), :] = x_ref[pl.ds(i, 1), :] * 2
                s_ref[0] = i + 1
                return carry

            lax.while_loop(lambda c: s_ref[0] < n, body, 0)
        elif kind == "switch":
            branches = [lambda j=j: o_ref.__setitem__((pl.ds(j, 1), slice(None)),
                                                      x_ref[pl.ds(j, 1), :] + j)
                        for j in range(3)]
            lax.switch(n % 3, branches)  # dynamic index: 5 % 3 -> branch 2
            for j in range(2):
                lax.switch(j, branches)
        elif kind == "pl-loop":
            @pl.loop(1, 8, step=2)
            def _(i):
                o_ref[pl.ds(i, 1), :] = x_ref[pl.ds(i, 1), :] - 1
    return kernel


def _control_reference(kind, n, x):
    x = np.asarray(x, np.float64)
    o = np.zeros_like(x)
    if kind == "cond":
        o = x * 2 if n > 2 else x - 1
        o = np.tile(o, (2, 1))
        o[8] = 0
        return o
    if kind == "while":
        for i in range(n):
            o[i] = x[i] * i + i
    elif kind == "scan":
        acc = np.zeros(128)
        for i in range(8):
            acc = acc + x[i]
            o[i] = acc
        o[7] = acc + 2 * sum(range(8))
    elif kind in ("fori-static", "fori-dynamic"):
        acc = np.zeros(128)
        for i in range(8 if kind == "fori-static" else n):
            o[i] = x[i] + acc
            acc = acc + o[i]
    elif kind == "fori-unrolled":
        o = x * 3
    elif kind == "jit":
        o = np.sin(x) * n + 1
    elif kind == "jit-ref":
        o[2:6] = x[2:6] * 3
    elif kind == "while-ref-cond":
        o[:n] = x[:n] * 2
    elif kind == "switch":
        o[:3] = x[:3] + np.arange(3)[:, None]
    elif kind == "pl-loop":
        o[1:8:2] = x[1:8:2] - 1
    return np.tile(o, (2, 1))


@pytest.mark.parametrize("kind", ["cond", "switch", "while", "while-ref-cond", "scan",
                                  "fori-static", "fori-dynamic", "fori-unrolled", "pl-loop",
                                  "jit", "jit-ref"])
def test_control_flow(check, kind):
    x = arange((8, 128), mod=17) / 8
    n = jnp.array([5], I32)

    def fn(n, x, interpret=False):
        return pl.pallas_call(
            _control_kernel(kind), grid=(2,),
            in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM),
                      pl.BlockSpec((8, 128), lambda i: (0, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct((16, 128), F32),
            scratch_shapes=[pltpu.SMEM((1,), I32)], interpret=interpret)(n, x)

    # JAX's HLO interpreter never ends a while_loop whose condition reads a ref that the
    # body writes (it loops forever on this kernel), so that one is checked against numpy.
    run_checked(check, fn, n, x, reference=_control_reference(kind, 5, x), rtol=1e-5,
                oracle=kind != "while-ref-cond")


# ---------------------------------------------------------------------------------------
# vmap of a pallas_call: program_id / num_programs see the grid without the batch axis,
# which the batching rule puts first; scalar prefetch and HBM operands batched too.

@pytest.mark.parametrize("kind", ["grid", "prefetch", "hbm-dma"])
def test_vmap(check, kind):
    xs = arange((3, 16, 256), mod=50)
    idxs = jnp.array([[1, 0], [0, 1], [1, 1]], I32)

    def one(x, idx, interpret=False):
        if kind == "grid":
            def kernel(x_ref, o_ref):
                o_ref[...] = x_ref[...] + pids_offset(2).astype(F32)

            spec = pl.BlockSpec((8, 128), lambda i, j: (i, j))
            return pl.pallas_call(kernel, grid=(2, 2), in_specs=[spec], out_specs=spec,
                                  out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                                  interpret=interpret)(x)
        if kind == "prefetch":  # batched scalar prefetch: JAX loops over the batch
            def kernel(s_ref, x_ref, o_ref):
                o_ref[...] = x_ref[...] + s_ref[pl.program_id(0)].astype(F32)

            grid_spec = pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, grid=(2,),
                in_specs=[pl.BlockSpec((8, 256), lambda i, s: (s[i], 0))],
                out_specs=pl.BlockSpec((8, 256), lambda i, s: (i, 0)))
            return pl.pallas_call(kernel, grid_spec=grid_spec,
                                  out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                                  interpret=interpret)(idx, x)

        # an HBM operand gains a squeezed batch dim: the kernel sees its batch's slice
        def kernel(x_hbm, o_ref, buf, sem):
            copy = pltpu.make_async_copy(x_hbm.at[pl.ds(8, 8)], buf, sem)
            copy.start()
            copy.wait()
            o_ref[...] = buf[...] * 2 + pl.program_id(0).astype(F32)

        return pl.pallas_call(kernel, grid=(2,), in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                              out_specs=pl.BlockSpec((8, 128), lambda i: (0, i)),
                              out_shape=jax.ShapeDtypeStruct((8, 256), F32),
                              scratch_shapes=[pltpu.VMEM((8, 128), F32),
                                              pltpu.SemaphoreType.DMA],
                              interpret=interpret)(x[:, :128])

    def fn(xs, idxs, interpret=False):
        return jax.vmap(functools.partial(one, interpret=interpret))(xs, idxs)

    x = np.asarray(xs)
    if kind == "grid":
        idx = np.indices((16, 256))
        want = x + ((idx[0] // 8) * 10 + idx[1] // 128 + 4000)[None]
    elif kind == "prefetch":
        ix = np.asarray(idxs)
        want = np.stack([np.concatenate([x[b, 8 * ix[b, i]: 8 * ix[b, i] + 8] + ix[b, i]
                                         for i in range(2)]) for b in range(3)])
    else:
        want = np.concatenate([x[:, 8:16, :128] * 2, x[:, 8:16, :128] * 2 + 1], axis=2)
    run_checked(check, fn, xs, idxs, reference=want)


# ---------------------------------------------------------------------------------------
# Ref indexing: dynamic and strided pl.ds, integer indices, reshape / bitcast views.

def _indexing_case(kind):
    """(kernel, input, out shape/dtype, numpy reference)."""
    if kind == "ds-dynamic":
        x = arange((32, 128))

        def kernel(x_ref, o_ref):
            i = pl.program_id(0)
            start = pl.multiple_of(i * 8, 8)
            o_ref[pl.ds(start, 8), :] = x_ref[pl.ds(start, 8), :] + 1
            o_ref[pl.ds(start, 8), pl.ds(0, 8)] = x_ref[pl.ds(start, 8), pl.ds(120, 8)]

        want = np.asarray(x) + 1
        want[:, :8] = np.asarray(x)[:, 120:]
        return kernel, x, jax.ShapeDtypeStruct((32, 128), F32), want, (4,)
    if kind == "ds-strided":
        x = arange((32, 128))

        def kernel(x_ref, o_ref):
            o_ref[pl.ds(0, 8), :] = x_ref[pl.ds(0, 8, stride=4), :]
            o_ref[pl.ds(8, 8), :] = x_ref[pl.ds(1, 8, stride=2), :]

        xn = np.asarray(x)
        return kernel, x, jax.ShapeDtypeStruct((16, 128), F32), \
            np.concatenate([xn[0:32:4], xn[1:17:2]]), ()
    if kind == "int-index":
        x = arange((4, 8, 128))

        def kernel(x_ref, o_ref):
            for j in range(4):
                o_ref[3 - j] = x_ref[j] * (j + 1)
            o_ref[0, 2, :] = x_ref[1, 3, :]
            o_ref[1, 0, 5] = jnp.float32(-1)

        xn = np.asarray(x)
        want = np.stack([xn[3 - j] * (4 - j) for j in range(4)])
        want[0, 2] = xn[1, 3]
        want[1, 0, 5] = -1
        return kernel, x, jax.ShapeDtypeStruct((4, 8, 128), F32), want, ()
    if kind == "at-view":
        x = arange((4, 8, 128))

        def kernel(x_ref, o_ref):
            sub = x_ref.at[2]
            o_ref[...] = sub[...] + sub.at[pl.ds(0, 8), pl.ds(0, 128)][...]

        return kernel, x, jax.ShapeDtypeStruct((8, 128), F32), np.asarray(x)[2] * 2, ()
    if kind == "reshape":
        x = arange((2, 8, 128))

        def kernel(x_ref, o_ref):
            o_ref[...] = x_ref.reshape(16, 128)[...] * 2

        return kernel, x, jax.ShapeDtypeStruct((16, 128), F32), \
            np.asarray(x).reshape(16, 128) * 2, ()
    if kind == "bitcast-32":
        x = arange((8, 128))

        def kernel(x_ref, o_ref):
            o_ref[...] = x_ref.bitcast(I32)[...]

        return kernel, x, jax.ShapeDtypeStruct((8, 128), I32), \
            np.asarray(x).view(np.int32), ()
    if kind == "bitcast-bf16":
        x = arange((16, 128), BF16, mod=100)

        def kernel(x_ref, o_ref):
            o_ref[...] = x_ref.bitcast(I32)[...]

        xn = np.asarray(x).view(np.uint16).astype(np.uint32)
        # TPU packing: two bf16 rows (2r, 2r+1) form one 32-bit row, low half first.
        want = (xn[0::2] | (xn[1::2] << 16)).view(np.int32)
        return kernel, x, jax.ShapeDtypeStruct((8, 128), I32), want, ()
    if kind == "value-bitcast":
        x = arange((16, 128), BF16, mod=100)

        def kernel(x_ref, o_ref):
            o_ref[...] = pltpu.bitcast(x_ref[...], I32)

        xn = np.asarray(x).view(np.uint16).astype(np.uint32)
        want = (xn[0::2] | (xn[1::2] << 16)).view(np.int32)
        return kernel, x, jax.ShapeDtypeStruct((8, 128), I32), want, ()
    if kind.startswith("dma-"):  # .at / strided / bitcast / reshape views given to DMAs
        x = arange((32, 128))
        xn = np.asarray(x)

        def kernel(x_hbm, o_ref, p_ref, buf, ibuf, sem):
            if kind == "dma-strided":
                src, dst = x_hbm.at[pl.ds(1, 8, stride=3)], buf
            elif kind == "dma-bitcast":
                src, dst = x_hbm.bitcast(I32).at[pl.ds(8, 8)], ibuf
            else:  # dma-reshape
                src, dst = x_hbm.reshape(4, 8, 128).at[2], buf
            copy = pltpu.make_async_copy(src, dst, sem)
            copy.start()
            copy.wait()
            o_ref[...] = buf[...] if kind != "dma-bitcast" else jnp.zeros((8, 128), F32)
            p_ref[...] = ibuf[...] if kind == "dma-bitcast" else jnp.zeros((8, 128), I32)

        want = {"dma-strided": [xn[1:24:3], np.zeros((8, 128), np.int32)],
                "dma-bitcast": [np.zeros((8, 128), np.float32), xn[8:16].view(np.int32)],
                "dma-reshape": [xn[16:24], np.zeros((8, 128), np.int32)]}[kind]
        extra = dict(in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                     scratch_shapes=[pltpu.VMEM((8, 128), F32), pltpu.VMEM((8, 128), I32),
                                     pltpu.SemaphoreType.DMA])
        out = [jax.ShapeDtypeStruct((8, 128), F32), jax.ShapeDtypeStruct((8, 128), I32)]
        return kernel, x, out, want, (), extra
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["ds-dynamic", "ds-strided", "int-index", "at-view",
                                  "reshape", "bitcast-32", "bitcast-bf16", "value-bitcast",
                                  "dma-strided", "dma-bitcast", "dma-reshape"])
def test_ref_indexing(check, kind):
    kernel, x, out, want, grid, *extra = _indexing_case(kind)
    extra = extra[0] if extra else {}

    def fn(x, interpret=False):
        return pl.pallas_call(kernel, grid=grid, out_shape=out, interpret=interpret,
                              **extra)(x)

    run_checked(check, fn, x, reference=want)


# ---------------------------------------------------------------------------------------
# Masked loads and stores.

def test_masked_load_store(check):
    from jax.experimental.pallas import triton as pl_triton  # load(..., other=)

    x = arange((8, 128))

    def fn(x, interpret=False):
        def kernel(x_ref, o_ref, p_ref):
            lanes = lax.broadcasted_iota(I32, (8, 128), 1)
            rows = lax.broadcasted_iota(I32, (8, 128), 0)
            o_ref[...] = jnp.full((8, 128), -1.0, F32)
            pltpu.store(o_ref, pltpu.load(x_ref) * 2, mask=lanes < 100)
            p_ref[...] = pl_triton.load(x_ref, mask=rows < 3, other=5.0)

        sds = jax.ShapeDtypeStruct(x.shape, x.dtype)
        return pl.pallas_call(kernel, out_shape=[sds, sds], interpret=interpret)(x)

    xn = np.asarray(x)
    lanes = np.arange(128)[None, :]
    rows = np.arange(8)[:, None]
    want = [np.where(lanes < 100, xn * 2, -1.0), np.where(rows < 3, xn, 5.0)]
    run_checked(check, fn, x, reference=want)


# ---------------------------------------------------------------------------------------
# skip_floats: int-only control flow stays exact; float results are inf.

def test_skip_floats(check):
    n = jnp.arange(16 * 128, dtype=I32).reshape(16, 128) % 9 + 1
    x = arange((16, 128))

    def fn(n, x, interpret=False):
        def kernel(n_ref, x_ref, steps_ref, f_ref):
            def cond(c):
                v, _ = c
                return jnp.any(v > 1)

            def body(c):
                v, s = c
                done = v <= 1
                nv = jnp.where(v % 2 == 0, v // 2, 3 * v + 1)
                return jnp.where(done, v, nv), s + jnp.where(done, 0, 1)

            _, steps = lax.while_loop(cond, body, (n_ref[...], jnp.zeros_like(n_ref)))
            steps_ref[...] = steps
            f_ref[...] = x_ref[...] * 2 + 1

        spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
        return pl.pallas_call(kernel, grid=(2,), in_specs=[spec, spec],
                              out_specs=[spec, spec],
                              out_shape=[jax.ShapeDtypeStruct(n.shape, I32),
                                         jax.ShapeDtypeStruct(x.shape, F32)],
                              interpret=interpret)(n, x)

    def collatz(v):
        s = 0
        while v > 1:
            v, s = (v // 2 if v % 2 == 0 else 3 * v + 1), s + 1
        return s

    steps = np.vectorize(collatz)(np.asarray(n)).astype(np.int32)
    r = check(fn, n, x, config=Config(skip_floats=True))
    assert r.session.engine_error is None, r.session.engine_error
    assert r.findings == []
    np.testing.assert_array_equal(r.value[0], steps)
    assert np.all(np.isinf(np.asarray(r.value[1])))
    # without skip_floats both are right, and agree with the oracle
    run_checked(check, fn, n, x, reference=[steps, x * 2 + 1])


# ---------------------------------------------------------------------------------------
# jax.grad through a custom_vjp whose fwd and bwd are pallas_calls.

def _cube_call(x, interpret):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] ** 3

    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    return pl.pallas_call(kernel, grid=(x.shape[0] // 8,), in_specs=[spec], out_specs=spec,
                          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          interpret=interpret)(x)


def _cube_grad_call(x, g, interpret):
    def kernel(x_ref, g_ref, o_ref):
        o_ref[...] = 3 * x_ref[...] ** 2 * g_ref[...]

    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    return pl.pallas_call(kernel, grid=(x.shape[0] // 8,), in_specs=[spec, spec],
                          out_specs=spec, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          interpret=interpret)(x, g)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def cube(x, interpret=False):
    return _cube_call(x, interpret)


cube.defvjp(lambda x, interpret: (_cube_call(x, interpret), x),
            lambda interpret, x, g: (_cube_grad_call(x, g, interpret),))


def test_grad_through_custom_vjp(check):
    x = arange((16, 128), mod=9) / 4 - 1

    def fn(x, interpret=False):
        return jax.jit(jax.grad(lambda x: jnp.sum(cube(x, interpret) * 2)))(x)

    run_checked(check, fn, x, reference=6 * x ** 2, calls=2, rtol=1e-5)


# ---------------------------------------------------------------------------------------
# The user's own interpret= is ignored: the call is still ours.

@pytest.mark.parametrize("interpret", [True, "params"], ids=["True", "InterpretParams"])
def test_user_interpret_still_intercepted(check, interpret):
    if interpret == "params":
        interpret = pltpu.InterpretParams()
    x = arange((16, 128))
    r = check(lambda: _cube_call(x, interpret))
    assert r.session.engine_error is None
    assert r.findings == []
    assert len(r.session.calls) == 1
    _assert_close(r.value, x ** 3, rtol=1e-6)
