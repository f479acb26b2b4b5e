"""engine/rules/access.py: a scalar load by in-bounds indices is read straight from its
buffer (`_scalar_get`), and with races on the race checker is still handed that element's
box: a scalar read of a written SMEM buffer that a second DMA into it, not yet waited
for, may be overwriting races with that DMA at exactly that element and the read's line,
and the same read after the wait is clean."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_check.config import Config, DmaMode
from pallas_check.intercept.session import Session


def _kernel(read_before_wait: bool):
    def kernel(idx_hbm, o_ref, idx_smem, sem):
        copy = pltpu.make_async_copy(idx_hbm, idx_smem, sem)
        copy.start()
        copy.wait()  # idx_smem is written everywhere: its scalar reads take the fast path
        again = pltpu.make_async_copy(idx_hbm, idx_smem, sem)
        again.start()
        if read_before_wait:
            early = idx_smem[3]  # READ
            again.wait()
        else:
            again.wait()
            early = idx_smem[3]
        o_ref[...] = jnp.full(o_ref.shape, early + idx_smem[5], jnp.int32)

    return kernel


def _call(read_before_wait: bool):
    return pl.pallas_call(
        _kernel(read_before_wait),
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.int32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        scratch_shapes=[pltpu.SMEM((16,), jnp.int32), pltpu.SemaphoreType.DMA(())],
    )


def _read_line() -> int:
    lines, start = inspect.getsourcelines(_kernel)
    return start + next(i for i, text in enumerate(lines) if "# READ" in text)


def _run(read_before_wait: bool, races: bool):
    idx = jnp.arange(16, dtype=jnp.int32) * 10
    session = Session(Config(dma_mode=DmaMode.ON_WAIT, races=races))
    with session.install():
        out = np.asarray(jax.block_until_ready(jax.jit(_call(read_before_wait))(idx)))
    assert session.engine_error is None, session.engine_error
    return out, session.findings


@pytest.mark.parametrize("races", [False, True])
def test_a_scalar_read_after_the_wait_is_clean_and_right(races):
    out, findings = _run(read_before_wait=False, races=races)
    np.testing.assert_array_equal(out, np.full((8, 128), 30 + 50, np.int32))
    assert findings == []


def test_a_scalar_read_before_the_wait_races_at_its_element_and_line():
    _, findings = _run(read_before_wait=True, races=True)
    races = [f for f in findings if f.kind.value == "race"]
    assert len(races) == 1, [f.message for f in findings]
    race = races[0]
    assert race.buffer == "idx_smem" and race.memory_space == "SMEM"
    assert race.index_range == ((3, 4),)
    (read,) = [a for a in race.accesses if a.operation == "read"]
    assert read.index_range == ((3, 4),) and read.frames[0].line == _read_line()
