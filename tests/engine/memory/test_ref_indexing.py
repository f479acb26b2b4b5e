"""Ref indexing (dynamic and strided pl.ds, integer indices, reshape / bitcast views) and
masked loads and stores, each checked three ways (see tests/_three_ways.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from _three_ways import F32, BF16, I32, run_checked, arange


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
