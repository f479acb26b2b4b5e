"""DMAs whose slices have traced sizes (issue #25, items 1 and 10).

A DMA moves and signals exactly the bytes of its actual slice; a wait takes off the bytes
of the descriptor it is given, evaluated with the same traced sizes; a zero-length DMA
moves and signals nothing. BlockSpec dimensions `pl.Element` / `pl.BoundedSlice` are the
same thing written as blocks.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_check.config import Config, DmaMode
from test_samples import SAMPLES, _describe, _matches, _run, expectations


@pytest.mark.parametrize("args", ["--dma on_wait --races", "--dma eager",
                                  "--dma random --schedules 20 --races"])
def test_dynamic_dma_ok_is_clean_in_every_dma_mode(cli, args):
    result = _run(cli, SAMPLES / "dynamic_dma_ok.py", args)
    assert result.findings == [], _describe(result.findings)
    assert result.exit_code == 0
    assert "output matches" in result.output


@pytest.mark.parametrize("mode", ["on_wait", "eager", "random"])
def test_dynamic_dma_bug_deadlocks_in_every_dma_mode(cli, mode):
    path = SAMPLES / "dynamic_dma_bug.py"
    (want,) = expectations(path)
    result = _run(cli, path, f"--dma {mode}")
    assert result.exit_code == 1
    assert [f["kind"] for f in result.findings] == ["deadlock"], _describe(result.findings)
    assert any(_matches(f, want, path) for f in result.findings), _describe(result.findings)
    assert "reach 32768 (it is 0)" in result.findings[0]["message"]


def _loop_wait_kernel(lens_ref, x_hbm, o_ref, buf, sem):
    """Two copies of lens[0] and lens[1] rows on one semaphore, started and then waited
    in pl.loops with the same traced sizes (`pl.ds(0, n)`)."""
    buf[...] = jnp.zeros_like(buf)

    @pl.loop(0, 2)
    def _(i):
        rows = pl.ds(0, lens_ref[i])
        pltpu.make_async_copy(x_hbm.at[rows], buf.at[rows], sem).start()

    @pl.loop(0, 2)
    def _(i):
        rows = pl.ds(0, lens_ref[i])
        pltpu.make_async_copy(x_hbm.at[rows], buf.at[rows], sem).wait()

    o_ref[...] = buf[...]


def _loop_wait(lens, x):
    return pl.pallas_call(
        _loop_wait_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(1,),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((8, 8, 128), lambda i, *_: (0, 0, 0)),
            scratch_shapes=[pltpu.VMEM((8, 8, 128), jnp.float32), pltpu.SemaphoreType.DMA]),
        out_shape=jax.ShapeDtypeStruct((8, 8, 128), jnp.float32))(lens, x)


@pytest.mark.parametrize("mode", list(DmaMode))
@pytest.mark.parametrize("lens", [(6, 2), (2, 6), (0, 3), (0, 0)])
def test_wait_in_a_loop_takes_each_iterations_size(check, mode, lens):
    """The issue's case: sizes 6 then 2 deadlocked (the wait kept its first size)."""
    x = jnp.arange(8 * 8 * 128, dtype=jnp.float32).reshape(8, 8, 128) + 1
    result = check(_loop_wait, np.array(lens, np.int32), x, config=Config(dma_mode=mode))
    assert result.findings == []
    want = np.zeros((8, 8, 128), np.float32)
    want[:max(lens)] = np.asarray(x)[:max(lens)]
    np.testing.assert_array_equal(np.asarray(result.value), want)
