"""Each finding says how to fix it where its checker knows (issue 36, items 2 and 3): the
DMA whose wait a read came before, the index map and grid point that chose a block outside
its array (and when the pipeline fetched it ahead), the blocks no grid point visits, the
signal without a matching wait; and a headline that says its kind once (item 4)."""

from __future__ import annotations

import inspect
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

from pallas_check.config import Config, DmaMode
from pallas_check.findings.finding import FindingKind

SAMPLES = Path(__file__).resolve().parents[2] / "samples"


def _line(path: object, marker: str) -> int:
    """The line of `path` that is `marker` (stripped), else the first holding it."""
    lines = open(str(path)).read().splitlines()
    exact = [i for i, line in enumerate(lines, 1) if line.strip() == marker]
    return exact[0] if exact else next(i for i, line in enumerate(lines, 1) if marker in line)


def test_a_read_before_a_dma_wait_names_the_dma_and_its_wait(cli):
    sample = SAMPLES / "dma_read_before_wait_bug.py"
    result = cli("run", "--races", str(sample))
    [uninit] = [f for f in result.report["findings"] if f["kind"] == "uninitialized"]
    start = _line(sample, "copy.start()")
    read = _line(sample, "y = buf[...] * 2.0")
    wait = _line(sample, "copy.wait()")
    assert (start, read, wait) == (23, 25, 26)  # the sample's own lines, as its docstring says
    path = str(sample)
    # The message names the DMA and its wait, not only the never-written buffer ...
    assert uninit["message"] == (
        f"1024 elements of output o_ref[0:8, 0:128] depend on memory that was never written:"
        f" read of buf[0:8, 0:128] at {path}:{read} (the read comes before the wait of DMA #1,"
        f" which fills buf: started at {path}:{start} and waited at line {wait}, after the"
        f" read) (kept by the program: result 0 of jax.jit(load_double)[0:8, 0:128], 1024"
        f" elements)")
    # ... and the help says which wait to move before which read.
    assert uninit["help"] == (
        f"DMA #1 (started at {path}:{start}) fills buf: move its wait (`copy.wait()`, line"
        f" {wait}) before the read of buf at line {read}, or read the other slot (a buffer no"
        f" DMA in flight is filling)")


def test_a_dma_never_waited_is_named_with_the_wait_to_call(check):
    from jax.experimental.pallas import tpu as pltpu

    def kernel(x_hbm, o_ref, buf, sem):
        copy = pltpu.make_async_copy(x_hbm, buf, sem)
        copy.start()
        o_ref[...] = buf[...]  # READ

    def call(x):
        return pl.pallas_call(
            kernel, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            scratch_shapes=[pltpu.VMEM(x.shape, x.dtype), pltpu.SemaphoreType.DMA])(x)

    checked = check(call, jnp.ones((8, 128), jnp.float32), config=Config(dma_mode=DmaMode.ON_WAIT))
    [uninit] = [f for f in checked.findings if f.kind == FindingKind.UNINITIALIZED]
    lines, first = inspect.getsourcelines(kernel)
    start = first + next(i for i, text in enumerate(lines) if "copy.start()" in text)
    read = first + next(i for i, text in enumerate(lines) if "# READ" in text)
    here = __file__
    assert uninit.help == (
        f"DMA #1 (started at {here}:{start}) fills buf: call `copy.wait()` before the read of"
        f" buf at line {read}, or read the other slot (a buffer no DMA in flight is filling)")
    assert uninit.message.endswith(f"(the read comes before the wait of DMA #1, which fills"
                                   f" buf: started at {here}:{start} and never waited) (kept"
                                   f" by the program: result 0 of the eager pallas_call"
                                   f"[0:8, 0:128], 1024 elements)")
    [not_waited] = [f for f in checked.findings if f.kind == FindingKind.DMA_NOT_WAITED]
    assert not_waited.help == (f"call `copy.wait()` for the DMA started at {here}:{start}"
                               " before buf is used and before the kernel returns")


def _next_block(x: jax.Array, grid: int, ahead: int) -> jax.Array:
    return pl.pallas_call(
        lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] + 1.0),
        grid=(grid,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i + ahead, 0))],  # INDEX MAP
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((grid * 8, 128), x.dtype))(x)


@pytest.mark.parametrize("mode", [DmaMode.ON_WAIT, DmaMode.EAGER])
def test_an_out_of_bounds_block_names_the_grid_point_whose_index_map_chose_it(check, mode):
    """Block (4, 0) comes from the index map at i = 3; the pipeline fetches it during grid
    point (2,), while step 2 runs: the finding is at (3,) and says it was prefetched."""
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    checked = check(_next_block, x, 4, 1, config=Config(dma_mode=mode))
    [oob] = [f for f in checked.findings if f.kind == FindingKind.OUT_OF_BOUNDS]
    index_map = _line(__file__, "# INDEX MAP")
    assert (oob.buffer, oob.index_range, oob.grid_point) == ("x_ref", ((32, 40), (0, 128)),
                                                             (3,))
    assert oob.frames[0].line == index_map
    assert oob.message == (
        "block index (4, 0) of x_ref, chosen by its index map at grid point (3,), selects"
        " x_ref[32:40, 0:128], outside the array of shape [32, 128] (dimension 0); the"
        " pipeline prefetches it during grid point (2,)")
    assert oob.details["prefetched_at"] == [2] and oob.details["block_index"] == [4, 0]
    assert oob.help == (
        f"the index map at {__file__}:{index_map} returns block (4, 0) at grid point (3,) (it"
        f" covers 32:40 of dimension 0, which has 32 elements): make it return a block"
        f" inside x_ref at every grid point (clamp it, e.g. with jnp.minimum), or shrink the"
        f" grid")
    # Everything in bounds still matches the reference.
    np.testing.assert_array_equal(np.asarray(checked.value)[:24], np.asarray(x)[8:32] + 1.0)


def test_a_block_fetched_at_its_own_step_is_no_prefetch(check):
    """The first block of the grid is fetched before step 0, at its own step."""
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    checked = check(_next_block, x, 1, 4)  # grid (1,): block (4, 0) at i = 0
    [oob] = [f for f in checked.findings if f.kind == FindingKind.OUT_OF_BOUNDS]
    assert oob.grid_point == (0,) and oob.details["prefetched_at"] is None
    assert "prefetch" not in oob.message
    assert oob.message.startswith("block index (4, 0) of x_ref, chosen by its index map at"
                                  " grid point (0,), selects x_ref[32:40, 0:128]")


def test_an_unwritten_output_names_the_blocks_no_grid_point_visits(cli):
    result = cli("run", str(SAMPLES / "unwritten_grid_bug.py"))
    [unwritten] = result.report["findings"]
    assert unwritten["message"] == ("1024 of 4096 elements of output o_ref are never written"
                                    " (within o_ref[24:32, 0:128]) (kept by the program:"
                                    " result 0 of jax.jit(double)[24:32, 0:128], 1024"
                                    " elements)")
    assert unwritten["help"] == (
        "no grid point visits block (3, 0) of o_ref (blocks of [8, 128]): make the grid and"
        " the out_specs index map cover every block of o_ref")


def test_an_output_partly_written_in_every_block_says_so(cli):
    result = cli("run", str(SAMPLES / "unwritten_half_bug.py"))
    [unwritten] = result.report["findings"]
    assert unwritten["help"] == (
        "every block of o_ref is visited by some grid point, but the kernel does not write"
        " all of it: write the whole [8, 128] block at every grid step that visits it (or"
        " alias o_ref to an input whose values it keeps)")


def test_a_semaphore_leak_names_the_signal_without_a_wait(cli):
    sample = SAMPLES / "semaphore_leak_bug.py"
    result = cli("run", str(sample))
    [leak] = result.report["findings"]
    line = _line(sample, "pl.semaphore_signal(sems.at[1])")
    assert leak["help"] == (
        f"the signal at {sample}:{line} (`pl.semaphore_signal(sems.at[1])`) has no matching"
        f" wait: add `pl.semaphore_wait(sems.at[1])` before the kernel returns, on the core"
        f" and device that own sems[1], or drop the signal")


def test_a_deadlock_headline_says_deadlock_once(cli):
    sample = SAMPLES / "deadlock_bug.py"
    result = cli("run", "--format", "text", str(sample), json_report=False)
    line = _line(sample, "pl.semaphore_wait(sems.at[1])")
    assert (f"samples/deadlock_bug.py:{line}:5: deadlock: wait_kernel [sems[1]]: core 0 waits"
            " in a semaphore wait for sems[1] to reach 1 (it is 0), and nothing can signal"
            " it\n") in result.output
    assert "deadlock: deadlock" not in result.output
