"""DMA and semaphore features, each checked three ways (see tests/_three_ways.py):
scratch semaphores, manual double-buffered DMAs with three copy APIs in both DMA modes,
DMAs across grid steps, pl.run_scoped with a DMA semaphore."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_check.config import Config, DmaMode

from _three_ways import F32, I32, signal, wait, read, run_checked, arange


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
